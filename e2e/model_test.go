package e2e

import (
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// kvInput is one client operation on one key.
type kvInput struct {
	put   bool
	key   string
	value string // put: the value written
}

// kvOutput is what the client saw. For a get, found/value; a put's output
// carries nothing (its outcome is in whether it returned).
type kvOutput struct {
	found bool
	value string
}

// kvState is one key's value.
type kvState struct {
	found bool
	value string
}

// kvModel is a register per key; histories are partitioned by key.
var kvModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(kvInput).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return kvState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(kvState), input.(kvInput), output.(kvOutput)
		if in.put {
			return true, kvState{found: true, value: in.value}
		}
		return out.found == s.found && out.value == s.value, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(kvInput), output.(kvOutput)
		if in.put {
			return fmt.Sprintf("put(%s, %s)", in.key, in.value)
		}
		if !out.found {
			return fmt.Sprintf("get(%s) -> absent", in.key)
		}
		return fmt.Sprintf("get(%s) -> %s", in.key, out.value)
	},
}

// pendingReturn is the return time of a write whose outcome is unknown
// (the client gave up): it may take effect at any point after its call.
const pendingReturn = math.MaxInt64

// history records operations from many goroutines.
type history struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

func newHistory() *history { return &history{start: time.Now()} }

func (h *history) now() int64 { return int64(time.Since(h.start)) }

func (h *history) add(client int, in kvInput, call, ret int64, out kvOutput) {
	h.mu.Lock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	h.mu.Unlock()
}

// check runs porcupine over the history.
func (h *history) check(timeout time.Duration) porcupine.CheckResult {
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	return porcupine.CheckOperationsTimeout(kvModel, ops, timeout)
}

// visualize writes porcupine's HTML view of the history (for a failure
// report) and returns its path.
func (h *history) visualize(timeout time.Duration) (string, error) {
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	_, info := porcupine.CheckOperationsVerbose(kvModel, ops, timeout)
	f, err := os.CreateTemp("", "synod-e2e-history-*.html")
	if err != nil {
		return "", err
	}
	defer f.Close()
	return f.Name(), porcupine.Visualize(kvModel, info, f)
}
