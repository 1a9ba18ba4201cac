package load

import (
	"fmt"
	"time"

	"synod/bench/hist"
)

// WireResult is a Result as it crosses a process boundary (kvbench runs
// the overload scenario's victims in a process of their own). It encodes
// to JSON; FromWire checks it.
type WireResult struct {
	Hists       []WireHist       `json:"hists"`
	Errors      []WireCount      `json:"errors,omitempty"`
	ErrorKinds  map[string]int64 `json:"error_kinds,omitempty"`
	Offered     int64            `json:"offered"`
	Done        int64            `json:"done"`
	Shed        int64            `json:"shed"`
	Elapsed     time.Duration    `json:"elapsed_ns"`
	ScheduleLag time.Duration    `json:"schedule_lag_ns"`
}

// WireHist is one histogram of a WireResult.
type WireHist struct {
	Key  Key       `json:"key"`
	Hist hist.Wire `json:"hist"`
}

// WireCount is one error count of a WireResult.
type WireCount struct {
	Key Key   `json:"key"`
	N   int64 `json:"n"`
}

// Wire returns r for another process. Call it once Run has returned.
func (r *Result) Wire() WireResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := WireResult{ErrorKinds: r.ErrorKinds, Offered: r.Offered, Done: r.Done, Shed: r.Shed,
		Elapsed: r.Elapsed, ScheduleLag: r.ScheduleLag}
	for k, h := range r.Hists {
		w.Hists = append(w.Hists, WireHist{Key: k, Hist: h.Wire()})
	}
	for k, n := range r.Errors {
		w.Errors = append(w.Errors, WireCount{Key: k, N: n})
	}
	return w
}

// FromWire returns the Result w holds, or why it cannot be one: a
// histogram that is not one of hist.New's, a key twice, a negative count,
// or more error kinds than a Result keeps.
func FromWire(w WireResult) (*Result, error) {
	r := &Result{Hists: map[Key]*hist.Hist{}, Errors: map[Key]int64{}, ErrorKinds: map[string]int64{},
		Offered: w.Offered, Done: w.Done, Shed: w.Shed, Elapsed: w.Elapsed, ScheduleLag: w.ScheduleLag}
	if w.Offered < 0 || w.Done < 0 || w.Shed < 0 || w.Elapsed < 0 || w.ScheduleLag < 0 {
		return nil, fmt.Errorf("load: a negative count or duration")
	}
	for _, h := range w.Hists {
		if _, dup := r.Hists[h.Key]; dup {
			return nil, fmt.Errorf("load: histogram %v twice", h.Key)
		}
		x, err := hist.FromWire(h.Hist)
		if err != nil {
			return nil, fmt.Errorf("load: histogram %v: %w", h.Key, err)
		}
		r.Hists[h.Key] = x
	}
	for _, e := range w.Errors {
		if _, dup := r.Errors[e.Key]; dup || e.N < 0 {
			return nil, fmt.Errorf("load: error count %v twice or negative", e.Key)
		}
		r.Errors[e.Key] = e.N
	}
	if len(w.ErrorKinds) > errorKindsMax {
		return nil, fmt.Errorf("load: %d error kinds, at most %d", len(w.ErrorKinds), errorKindsMax)
	}
	for k, n := range w.ErrorKinds {
		if n < 0 || len(k) > errorKindBytes {
			return nil, fmt.Errorf("load: error kind %q: a negative count or too long", k)
		}
		r.ErrorKinds[k] = n
	}
	return r, nil
}
