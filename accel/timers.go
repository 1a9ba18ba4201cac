package accel

import (
	"context"
	"time"
)

// RunTimers is the heartbeat and lease engine's own loop. It calls Tick for
// every time value received on ticks and hands the outputs (OutHeartbeat,
// OutLeaseGained/Lost, OutElectionTimeout) to emit, until ticks is closed
// or ctx is done. The runtime runs it on a dedicated goroutine (pinned to
// the accel core), so heartbeats and election timers keep their period
// however busy the Paxos and application goroutines are; emit should send
// heartbeats straight to the transport and hand lease and election events
// to software without blocking.
//
// ticks is a parameter rather than a clock so that tests drive the loop
// with a fake clock; RealTicks makes one from the wall clock.
func (p *Plane) RunTimers(ctx context.Context, ticks <-chan uint64, emit func([]Event)) {
	out := make([]Event, 0, timerEventsMax)
	for {
		select {
		case <-ctx.Done():
			return
		case now, ok := <-ticks:
			if !ok {
				return
			}
			out = p.Tick(out[:0], now)
			if len(out) > 0 {
				emit(out)
			}
		}
	}
}

// timerEventsMax bounds the outputs of one tick (lease, heartbeat, election).
const timerEventsMax = 4

// RealTicks sends the plane time (TickDuration units since epoch) every
// period until ctx is done. The channel holds one value: a slow consumer
// skips ticks rather than queueing stale ones.
func RealTicks(ctx context.Context, period time.Duration, epoch time.Time) <-chan uint64 {
	ch := make(chan uint64, 1)
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		defer close(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				select {
				case ch <- uint64(now.Sub(epoch) / TickDuration):
				default:
				}
			}
		}
	}()
	return ch
}
