package e2e

import (
	"context"
	"math"
	"os"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"synod/internal/kvmodel"
)

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

func (h *history) add(client int, in kvmodel.Input, call, ret int64, out kvmodel.Output) {
	h.mu.Lock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	h.mu.Unlock()
}

// check runs porcupine over the history.
func (h *history) check(timeout time.Duration) porcupine.CheckResult {
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	return porcupine.CheckOperationsTimeout(kvmodel.Model, ops, timeout)
}

// visualize writes porcupine's HTML view of the history (for a failure
// report) and returns its path.
func (h *history) visualize(timeout time.Duration) (string, error) {
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	_, info := porcupine.CheckOperationsVerbose(kvmodel.Model, ops, timeout)
	f, err := os.CreateTemp("", "synod-e2e-history-*.html")
	if err != nil {
		return "", err
	}
	defer f.Close()
	return f.Name(), porcupine.Visualize(kvmodel.Model, info, f)
}

// probeWrite sends the write in through put up to killProbeAttempts times
// (each bounded by killOpTimeout), recording every try in h as client
// killWorkers: an acknowledged one with its return, a failed one as
// pending (its outcome is unknown). It reports whether one was acknowledged.
func probeWrite(h *history, in kvmodel.Input, put func(ctx context.Context) error) bool {
	for i := 0; i < killProbeAttempts; i++ {
		ctx, cancel := ctxTimeout(killOpTimeout)
		call := h.now()
		err := put(ctx)
		cancel()
		if err == nil {
			h.add(killWorkers, in, call, h.now(), kvmodel.Output{})
			return true
		}
		h.add(killWorkers, in, call, pendingReturn, kvmodel.Output{})
	}
	return false
}
