package paxossim

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// linearizabilityTimeout bounds porcupine's search on one history; a
// history it cannot decide in time counts as a violation (unknown is not
// a pass).
const linearizabilityTimeout = 20 * time.Second

// returnNever is the Return time of an operation that never completed:
// porcupine then lets it take effect at any point after its call, or not
// at all when its output is unknown.
const returnNever = math.MaxInt64

// kvInput is the input of one client operation in a history.
type kvInput struct {
	Op     opKind
	Key    string
	Value  string
	Expect string
}

// kvOutput is its output. Known is false for an operation that never
// completed: its effect may or may not have happened.
type kvOutput struct {
	Known bool
	Value string // get: the value read; cas: resultTrue/resultFalse
}

// kvModel is the sequential specification of the KV store, partitioned by
// key so each key is checked on its own. The per-key state is the value.
var kvModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(kvInput).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		slices.Sort(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{""} },
	Step: func(state, input, output interface{}) []interface{} {
		s := state.(string)
		in := input.(kvInput)
		out := output.(kvOutput)
		switch in.Op {
		case opGet:
			if !out.Known || out.Value == s {
				return []interface{}{s}
			}
			return nil
		case opPut:
			return []interface{}{in.Value}
		case opAppend:
			return []interface{}{s + in.Value}
		case opCAS:
			swapped := s == in.Expect
			if !out.Known {
				if swapped {
					return []interface{}{in.Value}
				}
				return []interface{}{s}
			}
			if swapped && out.Value == resultTrue {
				return []interface{}{in.Value}
			}
			if !swapped && out.Value == resultFalse {
				return []interface{}{s}
			}
			return nil
		}
		return nil
	},
	DescribeOperation: func(input, output interface{}) string {
		in := input.(kvInput)
		out := output.(kvOutput)
		res := "?"
		if out.Known {
			res = fmt.Sprintf("%q", out.Value)
		}
		switch in.Op {
		case opCAS:
			return fmt.Sprintf("cas(%s, %q, %q) -> %s", in.Key, in.Expect, in.Value, res)
		case opGet:
			return fmt.Sprintf("get(%s) -> %s", in.Key, res)
		}
		return fmt.Sprintf("%s(%s, %q) -> %s", in.Op, in.Key, in.Value, res)
	},
}

// checkLinearizable checks a client history. It returns "" when the history
// is linearizable, else a reason.
func checkLinearizable(history []porcupine.Operation) string {
	if len(history) == 0 {
		return ""
	}
	res := porcupine.CheckOperationsTimeout(kvModel.ToModel(), history, linearizabilityTimeout)
	switch res {
	case porcupine.Ok:
		return ""
	case porcupine.Illegal:
		return fmt.Sprintf("client history of %d operations is not linearizable", len(history))
	default:
		return fmt.Sprintf("linearizability of %d operations undecided after %v", len(history), linearizabilityTimeout)
	}
}
