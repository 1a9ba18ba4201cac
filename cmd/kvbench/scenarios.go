package main

// Dispatch of a path's scenarios, and what the ceiling, tail, overload
// and load scenarios share: the path's measured capacity and the
// recorded window (CPU, leader changes, the nodes' /metrics).

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// pathRun is what one path's scenarios hand on to the next.
type pathRun struct {
	// capacity is the path's closed-loop puts/s (0: not measured yet);
	// capacitySource says which phase measured it.
	capacity       float64
	capacitySource string
}

// runScenario runs scenario s on c.
func runScenario(ctx context.Context, o *Options, c *cluster, w *workload, lw *leaderWatch, st *pathRun, s string, warmup time.Duration, bar *progress) (*PhaseResult, error) {
	switch s {
	case scenCeiling:
		return runCeiling(ctx, o, c, lw, st, warmup, bar)
	case scenTail:
		return runTail(ctx, o, c, lw, st, warmup, bar)
	case scenOverload:
		return runOverload(ctx, o, c, lw, st, warmup, bar)
	case scenLoad:
		return runLoad(ctx, o, c, lw, bar)
	}
	return runPhase(ctx, o, c, w, lw, s, warmup, bar)
}

// capacityOf returns the path's capacity: the ceiling phase's, or one
// measured now (closed loop, unrecorded apart from the figure) when the
// ceiling scenario did not run on this path.
func capacityOf(ctx context.Context, o *Options, c *cluster, st *pathRun, warmup time.Duration, why string) (float64, string, error) {
	if st.capacity > 0 {
		return st.capacity, st.capacitySource, nil
	}
	if o.Capacity > 0 {
		return o.Capacity, "given (--capacity)", nil
	}
	res, err := closedLoopPuts(ctx, o, c, warmup, o.Duration)
	if err != nil {
		return 0, "", err
	}
	if res.ok == 0 {
		return 0, "", fmt.Errorf("measuring capacity for %s: no put succeeded in %v (%d errors)", why, o.Duration, res.errors)
	}
	st.capacity = float64(res.ok) / o.Duration.Seconds()
	st.capacitySource = "measured before " + why
	return st.capacity, st.capacitySource, nil
}

// window records one phase's window on c: the nodes' CPU, the STATUS
// polls' leader changes and the nodes' /metrics between open and close.
// open may be called from a timer goroutine; close after it has
// returned.
type window struct {
	c    *cluster
	lw   *leaderWatch
	mu   sync.Mutex
	cpu0 float64
	host hostCPU // the machine's CPU time at open (host_steal.go)
	ww   *windowWatch
}

func (c *cluster) cpuSum() float64 {
	var s float64
	for _, pid := range c.pids() {
		v, _ := cpuSeconds(pid)
		s += v
	}
	return s
}

func (w *window) open(ctx context.Context) {
	cpu, host := w.c.cpuSum(), readHostCPU()
	ww := w.c.openWindow(ctx)
	w.mu.Lock()
	w.cpu0, w.host, w.ww = cpu, host, ww
	w.mu.Unlock()
	w.lw.reset()
}

// close fills ph's leader changes, CPU and cluster figures.
func (w *window) close(ctx context.Context, ph *PhaseResult) {
	cpu, host := w.c.cpuSum(), readHostCPU()
	ph.LeaderChanges = w.lw.count()
	w.mu.Lock()
	cpu0, host0, ww := w.cpu0, w.host, w.ww
	w.mu.Unlock()
	ph.HostStealPct = stealPct(host0, host)
	if cpu > cpu0 && len(w.c.procs) > 0 {
		ph.CPUSeconds = cpu - cpu0
	}
	if ww != nil {
		ph.Cluster = ww.close(ctx)
	}
}

// timedWindow opens a window after warmup (on a timer, as the open-loop
// schedule runs) and closes it at finish.
type timedWindow struct {
	w      *window
	t      *time.Timer
	opened chan struct{}
}

func openWindowAfter(ctx context.Context, c *cluster, lw *leaderWatch, warmup time.Duration) *timedWindow {
	tw := &timedWindow{w: &window{c: c, lw: lw}, opened: make(chan struct{})}
	tw.t = time.AfterFunc(warmup, func() { defer close(tw.opened); tw.w.open(ctx) })
	return tw
}

// finish closes the window (opening it first if the timer has not fired:
// a schedule that ended early).
func (tw *timedWindow) finish(ctx context.Context, ph *PhaseResult) {
	if tw.t.Stop() {
		tw.w.open(ctx)
	} else {
		<-tw.opened
	}
	tw.w.close(ctx, ph)
}
