package replica

import (
	"testing"
	"time"
)

// TestLoopWakesEveryQuarterHeartbeat holds loopWakeTicks's contract: the
// ticker wakes an idle consensus loop once every quarter heartbeat (the
// test clusters' 10-tick heartbeat: every 2 ticks), not every tick, and the
// cluster keeps its leader meanwhile (heartbeats and leases go on). A
// time.Ticker never fires more often than its period, so the count is
// bounded above; planted (testingWakeEveryTick) it is about twice that.
func TestLoopWakesEveryQuarterHeartbeat(t *testing.T) {
	const idle = time.Second
	for _, planted := range []bool{false, true} {
		testingWakeEveryTick = planted
		c := newTestCluster(t, 3, 0)
		l := c.leader()
		ballot := c.nodes[l].r.Status().Ballot
		before := map[int]uint64{}
		for id, n := range c.nodes {
			before[int(id)] = n.r.tickWakes.Load()
		}
		start := time.Now()
		time.Sleep(idle)
		elapsed := time.Since(start)
		period := time.Duration(loopWakeTicks(10)) * time.Millisecond
		bound := uint64(elapsed/(2*time.Millisecond)) + 2 // the unplanted period, 2 ticks
		most := uint64(0)
		for id, n := range c.nodes {
			w := n.r.tickWakes.Load() - before[int(id)]
			most = max(most, w)
			t.Logf("loop wakes: planted=%v node=%d ticker_wakes=%d over %v (period %v)", planted, id, w, elapsed.Round(time.Millisecond), period)
			if !planted && w > bound {
				t.Fatalf("node %d: %d ticker wake-ups in %v, at most %d at one per 2 ticks", id, w, elapsed, bound)
			}
		}
		if s := c.nodes[l].r.Status(); s.Ballot != ballot || c.leader() != l {
			t.Fatalf("planted %v: leadership changed while idle (ballot %v, then %v)", planted, ballot, s.Ballot)
		}
		testingWakeEveryTick = false
		c.stopAll()
		if planted && most <= bound {
			t.Fatalf("planted: at most %d ticker wake-ups, within the bound %d; the test does not see the every-tick ticker", most, bound)
		}
	}
}
