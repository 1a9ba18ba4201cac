package accel

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"synod/paxos"
)

func TestLeaseAndHeartbeat(t *testing.T) {
	p := newLeader(t, 3, 2, 16)
	spec := p.Spec()
	out := p.Tick(nil, 0)
	if countKind(out, OutHeartbeat) != 1 || countKind(out, OutLeaseGained) != 0 {
		t.Fatalf("first tick: %v", out)
	}
	// One ack for the heartbeat sent at 0 gives the quorum (2 of 3).
	p.OnHeartbeatAck(nil, 2, b(1, 1), 0)
	out = p.Tick(nil, 1)
	if countKind(out, OutLeaseGained) != 1 || !p.LeaseValid() {
		t.Fatalf("after ack: %v", out)
	}
	// Heartbeats every period, exactly.
	hb := 0
	span := uint64(spec.LeaseTicks - spec.LeaseDriftTicks)
	for now := uint64(2); now < span; now++ {
		hb += countKind(p.Tick(nil, now), OutHeartbeat)
	}
	if want := int((span - 1) / uint64(spec.HeartbeatPeriodTicks)); hb != want {
		t.Fatalf("%d heartbeats, want %d", hb, want)
	}
	// No further acks: the lease ends exactly at sentAt + LeaseTicks - drift.
	if out = p.Tick(nil, span); countKind(out, OutLeaseLost) != 1 || p.LeaseValid() {
		t.Fatalf("at lease end: %v", out)
	}
	// An ack echoing a future send time is refused; one with a foreign ballot too.
	if out = p.OnHeartbeatAck(nil, 2, b(1, 1), span+100); len(out) != 1 || out[0].Reason() != ReasonFuture {
		t.Fatalf("future ack: %v", out)
	}
	if out = p.OnHeartbeatAck(nil, 2, b(9, 2), span); len(out) != 1 || out[0].Reason() != ReasonBallot {
		t.Fatalf("foreign-ballot ack: %v", out)
	}
	// A new ballot forgets acks.
	p.OnHeartbeatAck(nil, 3, b(1, 1), span)
	if out = p.Tick(nil, span+1); countKind(out, OutLeaseGained) != 1 {
		t.Fatalf("re-gain: %v", out)
	}
	if out = p.SetBallot(nil, b(2, 1)); countKind(out, OutLeaseLost) != 1 {
		t.Fatalf("ballot change kept the lease: %v", out)
	}
}

func TestElectionTimer(t *testing.T) {
	p := newFollower(t, nil)
	spec := p.Spec()
	limit := uint64(spec.ElectionTicks + spec.ElectionJitterTicks)
	fired := uint64(0)
	for now := uint64(0); now <= limit; now += 100 {
		if countKind(p.Tick(nil, now), OutElectionTimeout) > 0 {
			if fired != 0 {
				t.Fatalf("election timeout fired twice")
			}
			fired = now
		}
	}
	if fired < uint64(spec.ElectionTicks) {
		t.Fatalf("fired at %d, before ElectionTicks=%d (limit %d)", fired, spec.ElectionTicks, limit)
	}
	// A heartbeat at the promised ballot re-arms it and is acked.
	out := p.OnHeartbeat(nil, 1, b(1, 1), 77)
	if len(out) != 1 || out[0].Kind != OutHeartbeatAck || out[0].Node != 1 || out[0].Value != 77 {
		t.Fatalf("heartbeat: %v", out)
	}
	if out = p.OnHeartbeat(nil, 1, b(0, 1), 78); len(out) != 1 || out[0].Reason() != ReasonStaleBallot {
		t.Fatalf("stale heartbeat: %v", out)
	}
	if out = p.OnHeartbeat(nil, 3, b(4, 3), 78); len(out) != 1 || out[0].Reason() != ReasonHigherBallot {
		t.Fatalf("higher-ballot heartbeat: %v", out)
	}
}

// TestHeartbeatsUnderSaturatedApplication runs a 3-node group on a fake
// clock: each plane's timers on their own goroutine, heartbeats and acks
// delivered plane to plane, while one "application" goroutine per node
// spins on the CPU and hammers its plane (the busy Paxos/apply side). The
// heartbeats must keep their period, no follower may time out and the
// leader's lease must hold from its first quorum of acks to the end.
func TestHeartbeatsUnderSaturatedApplication(t *testing.T) {
	spec := DefaultSpec()
	spec.Replicas, spec.Quorum, spec.WindowSlots = 3, 2, 64
	planes := make([]*Plane, 3)
	for i := range planes {
		p, err := New(spec)
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 3; j++ {
			p.SetMember(nil, j, paxos.NodeID(j+1))
		}
		p.SetSelf(nil, i)
		p.SetPromised(nil, b(1, 1))
		p.SetTenant(nil, 0, 1000, 10, 0, 0)
		planes[i] = p
	}
	leader := planes[0]
	leader.SetBallot(nil, b(1, 1))
	leader.SetRole(nil, RoleLeader)
	planes[1].SetRole(nil, RoleFollower)
	planes[2].SetRole(nil, RoleFollower)

	var heartbeats, timeouts, lost atomic.Int64
	var gained atomic.Bool
	// Heartbeats go straight from the leader's timer loop to the followers'
	// planes and their acks straight back: the accel path never waits for
	// an application goroutine.
	emit := func(i int) func([]Event) {
		return func(evs []Event) {
			for _, e := range evs {
				switch e.Kind {
				case OutHeartbeat:
					heartbeats.Add(1)
					for _, f := range planes[1:] {
						for _, a := range f.OnHeartbeat(nil, 1, e.Ballot, e.Value) {
							if a.Kind == OutHeartbeatAck {
								leader.OnHeartbeatAck(nil, paxos.NodeID(f.s.self+1), a.Ballot, a.Value)
							}
						}
					}
				case OutElectionTimeout:
					timeouts.Add(1)
				case OutLeaseGained:
					gained.Store(true)
				case OutLeaseLost:
					lost.Add(1)
				}
			}
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	ticks := make([]chan uint64, 3)
	for i := range planes {
		ticks[i] = make(chan uint64)
		wg.Add(1)
		go func() { defer wg.Done(); planes[i].RunTimers(ctx, ticks[i], emit(i)) }()
	}
	// The saturated application: as many spinning goroutines as CPUs, each
	// hammering a plane with shaper admissions and burning CPU in between.
	var appOps atomic.Int64
	var appWG, appRan sync.WaitGroup
	stop := make(chan struct{})
	for i := 0; i < max(runtime.GOMAXPROCS(0), 2); i++ {
		appWG.Add(1)
		appRan.Add(1)
		go func() {
			defer appWG.Done()
			x := uint64(i)
			for first := true; ; first = false {
				if !first {
					select {
					case <-stop:
						return
					default:
					}
				}
				for k := 0; k < 10_000; k++ {
					x = x*6364136223846793005 + 1442695040888963407
				}
				planes[int(x>>60)%3].Admit(0, 100)
				appOps.Add(1)
				if first {
					appRan.Done()
				}
			}
		}()
	}
	// Every spinner runs before the ticks start: the tick loop takes a
	// few milliseconds, and a spinner the scheduler had not started by
	// then would see stop closed and never load anything (CI: app_ops of
	// 1-4 in some runs).
	appRan.Wait()

	const stepTicks, steps = 1000, 2000 // 2 s of plane time in 1 ms steps
	for s := 0; s <= steps; s++ {
		for i := range ticks {
			ticks[i] <- uint64(s * stepTicks)
		}
	}
	close(stop)
	appWG.Wait()
	cancel()
	wg.Wait()

	wantHB := int64(steps*stepTicks/int(spec.HeartbeatPeriodTicks)) + 1
	fmt.Printf("accel: heartbeats=%d (want %d) election_timeouts=%d lease_lost=%d app_ops=%d\n",
		heartbeats.Load(), wantHB, timeouts.Load(), lost.Load(), appOps.Load())
	if heartbeats.Load() != wantHB {
		t.Errorf("heartbeats=%d, want %d", heartbeats.Load(), wantHB)
	}
	if timeouts.Load() != 0 || lost.Load() != 0 || !gained.Load() {
		t.Errorf("election timeouts=%d lease lost=%d gained=%v", timeouts.Load(), lost.Load(), gained.Load())
	}
	if appOps.Load() == 0 {
		t.Errorf("the application loop never ran")
	}
}
