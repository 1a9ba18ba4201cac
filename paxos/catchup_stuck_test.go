package paxos

import (
	"fmt"
	"testing"
)

// TestStuckCatchupOffersSnapshot: an acceptor that takes none of the
// catch-ups sent to it (its application drops them: no room in its log)
// is offered the leader's applied state once its commit index stood still
// through catchupStuckSendsMin catch-ups and catchupStuckTicks, though the
// leader has compacted nothing; it installs it and catches up. Planted
// (TestingNoStuckCatchupOffer): it stays behind.
func TestStuckCatchupOffersSnapshot(t *testing.T) {
	defer func() { TestingNoStuckCatchupOffer = false }()
	ticks, ok := stuckCatchup(t)
	if !ok {
		t.Fatalf("node 3 did not catch up in %d ticks", ticks)
	}
	TestingNoStuckCatchupOffer = true
	pTicks, pOK := stuckCatchup(t)
	if pOK {
		t.Fatalf("planted (no offer): node 3 caught up in %d ticks: the test does not show the gap", pTicks)
	}
	fmt.Printf("stuck catch-up: caught_up_after_ticks=%d (by the snapshot offer); planted (no offer): behind_after_ticks=%d\n", ticks, pTicks)
}

func stuckCatchup(t *testing.T) (ticks int, caughtUp bool) {
	const k = 30
	nw := newNetwork(t, 3)
	for nw.leader() != 1 {
		nw.nodes[1].electionElapsed = nw.nodes[1].electionTimeout
		nw.tick(1)
	}
	// Node 3 misses the accepts, then drops every catch-up.
	nw.dropNext = func(m Message) bool { return m.To == 3 && (m.Type == MsgAccept || m.Type == MsgCatchup) }
	for i := range k {
		nw.propose(1, fmt.Sprint(i))
	}
	nw.tick(1)
	if c := nw.nodes[3].Status().Commit; c >= k {
		t.Fatalf("node 3 committed %d: the test needs it behind", c)
	}
	if nw.nodes[1].snap != nil {
		t.Fatalf("the leader compacted: the test needs the catch-up path")
	}
	limit := 12 * nw.nodes[1].cfg.ElectionTicks
	for ticks = 1; ticks <= limit; ticks++ {
		nw.tick(1)
		if nw.nodes[3].Status().Commit >= nw.nodes[1].Status().Commit {
			return ticks, true
		}
	}
	return ticks - 1, false
}
