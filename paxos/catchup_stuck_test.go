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

// TestStuckCountRestartsAfterSilence: a lagging acceptor that was sent a
// catch-up and then went down for ten election timeouts comes back with
// its commit index where it stopped and takes no catch-up at first (a
// slow restart); the leader, whose log holds every slot it missed, offers
// it no snapshot before catchupStuckTicks of catch-ups since its return.
// Planted (TestingStuckAcrossSilence: the count from before the outage
// stands): the offer comes a few catch-ups after the return.
func TestStuckCountRestartsAfterSilence(t *testing.T) {
	defer func() { TestingStuckAcrossSilence = false }()
	offers, window, caughtUp := stuckAfterSilence(t)
	if offers != 0 {
		t.Fatalf("%d snapshot offers to the returned acceptor within %d ticks of its return", offers, window)
	}
	if !caughtUp {
		t.Fatal("node 3 did not catch up from the log once it took catch-ups")
	}
	TestingStuckAcrossSilence = true
	pOffers, _, _ := stuckAfterSilence(t)
	if pOffers == 0 {
		t.Fatal("planted (count kept across the silence): no offer either: the test does not show the gap")
	}
	fmt.Printf("stuck count after silence: offers=%d within_ticks=%d; planted (count kept): offers=%d\n", offers, window, pOffers)
}

// stuckAfterSilence returns the snapshot offers node 3 got within the
// window after its return, the window's ticks, and whether node 3 caught
// up from the log once it took catch-ups again.
func stuckAfterSilence(t *testing.T) (offers, window int, caughtUp bool) {
	nw := newNetwork(t, 3)
	for nw.leader() != 1 {
		nw.nodes[1].electionElapsed = nw.nodes[1].electionTimeout
		nw.tick(1)
	}
	dropCatchup := true
	nw.dropNext = func(m Message) bool {
		if m.To != 3 {
			return false
		}
		if m.Type == MsgSnapshot {
			offers++
			return true
		}
		return m.Type == MsgAccept || (dropCatchup && m.Type == MsgCatchup)
	}
	nw.propose(1, "a", "b", "c")
	nw.tick(int(nw.nodes[1].catchupResendTicks()) + 1) // a catch-up or two went, dropped
	ld := nw.nodes[1]
	p := ld.lead.peers[3]
	if p.stuckSends == 0 {
		t.Fatal("no catch-up went to node 3 before its outage: the test needs one")
	}
	before := nw.nodes[3].Status().Commit
	nw.crash(3)
	nw.tick(10 * ld.cfg.ElectionTicks)
	nw.restart(3)
	if c := nw.nodes[3].Status().Commit; c != before {
		t.Fatalf("node 3 came back at commit %d, not %d where it stopped: the test needs it unmoved", c, before)
	}
	if ld.snap != nil {
		t.Fatal("the leader compacted: the test needs its log to hold every slot")
	}
	// Within catchupStuckTicks of the return, but long enough for more
	// than catchupStuckSendsMin catch-ups at the resend pace.
	window = int(ld.catchupStuckTicks()) - 2
	if sends := window / int(ld.catchupResendTicks()); sends <= catchupStuckSendsMin {
		t.Fatalf("the window holds %d catch-ups, not more than %d", sends, catchupStuckSendsMin)
	}
	offers = 0
	nw.tick(window)
	dropCatchup = false
	nw.tick(int(ld.catchupResendTicks()) + 1)
	return offers, window, nw.nodes[3].Status().Commit >= ld.Status().Commit
}
