package main

// The ceiling scenario: a path's throughput ceiling, closed loop. A fixed
// number of requests (--ceiling-inflight, 256) are kept in flight: each
// worker sends a PUT of --value-bytes to a uniformly drawn key of the
// load tenant (uncontracted, standard priority) and sends the next as
// soon as the answer is in. Successful puts per second of the recorded
// window are the path's capacity, which the tail and overload scenarios
// then load relative to. Latency here is from the actual send (closed
// loop): it is the queueing that many requests in flight cause, not a
// tail figure.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"synod/bench/hist"
	"synod/kv/client"
)

// Limits of the closed loop.
const (
	// ceilingClientsMax: the in-flight requests are spread over at most
	// this many client objects (each keeps at most the server's window of
	// unanswered writes, proto.InflightPerConnMax).
	ceilingClientsMax = 8
	// errorKindBytes and errorKindsMax bound an error breakdown.
	errorKindBytes = 80
	errorKindsMax  = 32
)

// CeilingResult is the ceiling scenario's figures (the latency summary is
// the phase's Write).
type CeilingResult struct {
	Inflight   int     `json:"inflight"`
	Clients    int     `json:"clients"`
	PutsPerSec float64 `json:"puts_per_sec"`
	Errors     int64   `json:"errors"`
}

// errorKinds counts errors by message, bounded.
type errorKinds struct {
	mu sync.Mutex
	m  map[string]int64
}

func (e *errorKinds) add(err error) {
	msg := err.Error()
	if len(msg) > errorKindBytes {
		msg = msg[:errorKindBytes]
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[string]int64{}
	}
	if _, ok := e.m[msg]; ok || len(e.m) < errorKindsMax {
		e.m[msg]++
	}
}

func (e *errorKinds) snapshot() map[string]int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.m) == 0 {
		return nil
	}
	out := make(map[string]int64, len(e.m))
	for k, v := range e.m {
		out[k] = v
	}
	return out
}

// dialLoadClients dials n clients of tenant token (retries as kvbench's
// workload clients).
func dialLoadClients(ctx context.Context, c *cluster, token string, n, retries int) ([]*client.Client, error) {
	var out []*client.Client
	for range n {
		cl, err := dialTenant(ctx, c.endpoints, token, retries)
		if err != nil {
			closeClients(out)
			return nil, fmt.Errorf("dialing a scenario client: %w", err)
		}
		out = append(out, cl)
	}
	return out, nil
}

func closeClients(cls []*client.Client) {
	for _, cl := range cls {
		cl.Close()
	}
}

// closedLoopResult is one closed-loop run's recorded window.
type closedLoopResult struct {
	ok, errors int64
	lat        *hist.Hist
	kinds      map[string]int64
	clients    int
}

// closedLoopPuts keeps o.CeilingInflight puts in flight for warmup +
// duration and counts those that completed in the recorded window
// (started after warmup, answered before its end).
func closedLoopPuts(ctx context.Context, o *Options, c *cluster, warmup, duration time.Duration) (*closedLoopResult, error) {
	nc := min(ceilingClientsMax, o.CeilingInflight)
	cls, err := dialLoadClients(ctx, c, c.tokenFor(loadTenantToken), nc, client.RetriesMaxDefault)
	if err != nil {
		return nil, err
	}
	defer closeClients(cls)
	value := make([]byte, o.ValueBytes)
	for i := range value {
		value[i] = byte('A' + i%26)
	}
	res := &closedLoopResult{lat: hist.New(), clients: nc}
	var ok, fails atomic.Int64
	var kinds errorKinds
	start := time.Now()
	from, end := start.Add(warmup), start.Add(warmup+duration)
	var wg sync.WaitGroup
	for k := range o.CeilingInflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := cls[k%nc]
			rng := rand.New(rand.NewPCG(o.Seed, uint64(k)))
			for ctx.Err() == nil {
				sent := time.Now()
				if !sent.Before(end) {
					return
				}
				octx, cancel := context.WithTimeout(ctx, opTimeout)
				err := cl.Put(octx, keyOf(rng.IntN(o.Keys)), value)
				cancel()
				done := time.Now()
				if sent.Before(from) || done.After(end) {
					continue // outside the recorded window
				}
				res.lat.Record(done.Sub(sent))
				if err != nil {
					fails.Add(1)
					kinds.add(err)
					continue
				}
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	res.ok, res.errors, res.kinds = ok.Load(), fails.Load(), kinds.snapshot()
	return res, nil
}

// runCeiling measures the path's capacity and records it for the
// scenarios after it.
func runCeiling(ctx context.Context, o *Options, c *cluster, lw *leaderWatch, st *pathRun, warmup time.Duration, bar *progress) (*PhaseResult, error) {
	ph := &PhaseResult{Scenario: scenCeiling}
	tw := openWindowAfter(ctx, c, lw, warmup)
	stop := progressTicker(bar.phase, warmup+o.Duration)
	res, err := closedLoopPuts(ctx, o, c, warmup, o.Duration)
	stop()
	tw.finish(ctx, ph)
	if err != nil {
		return nil, err
	}
	ph.Write = res.lat.Summary()
	ph.All = ph.Write
	ph.WriteCurve = res.lat.Curve()
	ph.Done, ph.Errors, ph.ErrorKinds = res.ok+res.errors, res.errors, res.kinds
	ph.ThroughputOps = float64(res.ok) / o.Duration.Seconds()
	if res.ok > 0 && ph.CPUSeconds > 0 {
		ph.CPUPer1000 = ph.CPUSeconds / float64(res.ok) * 1000
	}
	ph.Ceiling = &CeilingResult{Inflight: o.CeilingInflight, Clients: res.clients, PutsPerSec: ph.ThroughputOps, Errors: res.errors}
	if res.ok == 0 {
		return ph, errors.New("no put succeeded: no capacity to measure")
	}
	st.capacity, st.capacitySource = ph.ThroughputOps, "ceiling phase"
	return ph, nil
}

// progressTicker reports the fraction of a phase of length d gone by
// (every 100 ms, below 1) for a phase that has no schedule of its own to
// report it; stop ends the phase and reports 1.
func progressTicker(report func(frac float64), d time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if f := float64(time.Since(start)) / float64(d); f < 1 {
					report(f)
				}
			}
		}
	}()
	return func() { close(done); wg.Wait(); report(1) }
}
