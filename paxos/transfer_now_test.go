package paxos

import (
	"errors"
	"slices"
	"testing"
)

// TestTransferLeadershipNow: the wedge the hand-over at once exists for. The
// leader's own vote waits (its persist held, as for a full acceptor log)
// and one follower cannot reach it, so a slot stays in flight: the
// ordinary hand-over waits for commit == last slot and gives up; the
// hand-over at once steps down on the call (no lease left on the old
// leader), the target is elected, its phase 1 finds the value in flight,
// and every node applies it once, in agreement.
func TestTransferLeadershipNow(t *testing.T) {
	nw, l, to, _ := ownVoteHeld(t)
	nw.propose(l, "x")
	st := nw.nodes[l].Status()
	if st.Commit == st.LastSlot {
		t.Fatalf("slot %d committed with the leader's vote held and one follower cut off", st.LastSlot)
	}

	// The ordinary hand-over cannot complete: something is in flight.
	if err := nw.nodes[l].TransferLeadership(to); err != nil {
		t.Fatal(err)
	}
	nw.tick(nw.cfgElection() + 1)
	if st := nw.nodes[l].Status(); st.Role != RoleLeader || st.Transferring != 0 {
		t.Fatalf("the ordinary hand-over with a slot in flight: %+v (want it given up, still leading)", st)
	}

	if err := nw.nodes[l].TransferLeadershipNow(9); err == nil {
		t.Fatal("a hand-over at once to a non-voter was started")
	}
	if err := nw.nodes[l].TransferLeadershipNow(to); err != nil {
		t.Fatal(err)
	}
	if st, ls := nw.nodes[l].Status(), nw.nodes[l].LeaseState(); st.Role == RoleLeader || ls.LeaderUntil != 0 {
		t.Fatalf("after the hand-over at once the old leader still leads: %+v %+v", st, ls)
	}
	if err := nw.nodes[l].TransferLeadershipNow(to); err != ErrNotLeader {
		t.Fatalf("a second hand-over from the node that stepped down: %v", err)
	}
	ticks := waitLeader(t, nw, to)
	nw.persistOwn(l) // the old leader's own write completes late
	nw.heal()
	nw.propose(to, "b")
	nw.tick(3)
	for _, id := range nw.ids {
		if got := nw.cmds(id); !slices.Equal(got, []string{"a", "x", "b"}) {
			t.Fatalf("node %d applied %v, want [a x b]", id, got)
		}
	}
	nw.checkAgree()
	t.Logf("hand-over at once: node %d -> %d in %d ticks with a slot in flight", l, to, ticks)
}

// TestTransferLeadershipNowDuringConfChange: with a membership change in
// flight (it cannot commit: the leader's vote held, one follower cut off)
// the ordinary hand-over is refused (ErrConfChangeBusy) and the hand-over
// at once is not: the target is elected, its phase 1 finds the change in
// flight, and every node ends with the new membership, in agreement.
func TestTransferLeadershipNowDuringConfChange(t *testing.T) {
	nw, l, to, cut := ownVoteHeld(t)
	nw.start(4, testConfig(4, []NodeID{1, 2, 3}))
	if err := nw.nodes[l].ProposeConfChange(ConfChange{Type: ConfAddLearner, Node: 4}); err != nil {
		t.Fatal(err)
	}
	nw.settle()
	if st := nw.nodes[l].Status(); st.Commit == st.LastSlot || len(st.Learners) != 0 {
		t.Fatalf("the membership change committed with the leader's vote held and one follower cut off: %+v", st)
	}
	if err := nw.nodes[l].TransferLeadership(to); !errors.Is(err, ErrConfChangeBusy) {
		t.Fatalf("the ordinary hand-over with a membership change in flight: %v, want ErrConfChangeBusy", err)
	}
	if err := nw.nodes[l].TransferLeadershipNow(to); err != nil {
		t.Fatalf("the hand-over at once with a membership change in flight: %v", err)
	}
	if st := nw.nodes[l].Status(); st.Role == RoleLeader {
		t.Fatalf("the old leader still leads: %+v", st)
	}
	ticks := waitLeader(t, nw, to)
	nw.persistOwn(l)
	nw.heal()
	nw.propose(to, "b")
	nw.tick(testConfig(4, nil).LeaseTicks + 3)
	for _, id := range []NodeID{l, to, cut} {
		st := nw.nodes[id].Status()
		if !slices.Equal(st.Learners, []NodeID{4}) || !slices.Equal(nw.cmds(id), []string{"a", "b"}) {
			t.Fatalf("node %d: learners %v, applied %v; want [4] and [a b]", id, st.Learners, nw.cmds(id))
		}
	}
	nw.checkAgree()
	t.Logf("hand-over at once with a membership change in flight: node %d -> %d in %d ticks", l, to, ticks)
}

// ownVoteHeld elects a leader l of three nodes, commits "a", cuts follower
// cut off from l both ways and holds l's own persists: nothing l proposes
// next can commit (l's vote waits, to's ack alone is no quorum), and to is
// the follower that still reaches it.
func ownVoteHeld(t *testing.T) (nw *network, l, to, cut NodeID) {
	nw = newNetwork(t, 3)
	l = nw.elect()
	nw.propose(l, "a")
	nw.tick(2)
	f := others(nw, l)
	to, cut = f[0], f[1]
	nw.cut[[2]NodeID{l, cut}] = true
	nw.cut[[2]NodeID{cut, l}] = true
	nw.own.hold(l)
	return nw, l, to, cut
}

// waitLeader ticks until to leads, at most an election timeout, and
// returns how many ticks that took.
func waitLeader(t *testing.T, nw *network, to NodeID) int {
	t.Helper()
	ticks := 0
	for ; ticks < nw.cfgElection() && nw.leader() != to; ticks++ {
		nw.tick(1)
	}
	if nw.leader() != to {
		t.Fatalf("leader %d after %d ticks, want %d", nw.leader(), ticks, to)
	}
	return ticks
}
