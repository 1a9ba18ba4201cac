package paxos

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestNoRoomNoElection: a node whose entries above its commit index would
// not fit in the log room it declared does not campaign, even when its
// timer fires first and a pre-check would be granted; the node with room
// leads, the other catches up and may campaign again. It is the e2e wedge
// of logroom.go in small: nodes 2 and 3 restart with their applied slot
// far behind the entries they hold (their apply had lagged), node 1 is
// gone, and node 3 (the shortest timer) has room for few of them. Planted
// (TestingIgnoreLogRoom): node 3 wins.
func TestNoRoomNoElection(t *testing.T) {
	defer func() { TestingIgnoreLogRoom = false }()
	leader, deferred, ticks := noRoomElection(t, false)
	if leader != 2 || deferred == 0 {
		t.Fatalf("leader %d after %d ticks, node 3 deferred %d elections: want node 2, and node 3 deferring", leader, ticks, deferred)
	}
	TestingIgnoreLogRoom = true
	pLeader, _, pTicks := noRoomElection(t, false)
	if pLeader != 3 {
		t.Fatalf("planted (room ignored): leader %d after %d ticks: want node 3, or the test does not show the election the rule prevents", pLeader, pTicks)
	}
	fmt.Printf("log room: leader=2 after %d ticks, node 3 deferred %d elections; planted (room ignored): node 3 led after %d ticks\n", ticks, deferred, pTicks)
}

// TestNoRoomAnywhereStillElects: when every live member lacks the room,
// each defers for deferralMaxTicks and then campaigns as before the rule:
// the group elects a leader, not before the bound; planted
// (TestingDeferForever): none in 400 ticks.
func TestNoRoomAnywhereStillElects(t *testing.T) {
	defer func() { TestingDeferForever = false }()
	leader, deferred, ticks := noRoomElection(t, true)
	bound := int(10 * testConfig(1, nil).ElectionTicks)
	if leader == 0 || ticks < bound || deferred == 0 {
		t.Fatalf("leader %d after %d ticks (%d deferred on node 3): want one, after at least %d ticks of deferral", leader, ticks, deferred, bound)
	}
	TestingDeferForever = true
	pLeader, _, pTicks := noRoomElection(t, true)
	if pLeader != 0 {
		t.Fatalf("planted (deferral unbounded): leader %d after %d ticks: the test does not show the wedge", pLeader, pTicks)
	}
	fmt.Printf("log room everywhere short: leader=%d after %d ticks (bound %d); planted (deferral unbounded): no leader in %d ticks\n", leader, ticks, bound, pTicks)
}

func noRoomElection(t *testing.T, bothShort bool) (leader NodeID, deferred uint64, ticks int) {
	const k, cmdBytes = 40, 1 << 10
	nw := newNetwork(t, 3)
	for nw.leader() != 1 {
		nw.nodes[1].electionElapsed = nw.nodes[1].electionTimeout
		nw.tick(1)
	}
	for i := range k {
		nw.propose(1, fmt.Sprintf("%04d%s", i, strings.Repeat("x", cmdBytes)))
	}
	nw.tick(1)
	for _, id := range []NodeID{2, 3} {
		if c := nw.nodes[id].Status().Commit; c < k {
			t.Fatalf("node %d committed %d, want >= %d", id, c, k)
		}
	}
	// Nodes 2 and 3 restart having applied only the first slot: every
	// entry above it is uncommitted as far as they know.
	nw.crash(1)
	for _, id := range []NodeID{2, 3} {
		nw.crash(id)
		nw.durable[id].applied = 1
		nw.applied[id] = nw.applied[id][:1]
		nw.restart(id)
	}
	n2, n3 := nw.nodes[2], nw.nodes[3]
	need := n3.reproposalBytes(1 << 40)
	n3.SetLogRoom(need / 4)
	if bothShort {
		n2.SetLogRoom(need / 4)
	}
	for ticks = 1; ticks <= 400; ticks++ {
		// Node 3's timer is the shortest, node 2's the longest.
		n3.electionTimeout = n3.cfg.ElectionTicks
		n2.electionTimeout = 2*n2.cfg.ElectionTicks - 1
		nw.tick(1)
		if ticks == n3.cfg.LeaseTicks+1 && !TestingIgnoreLogRoom && !bothShort {
			// The restart's lease has run out; node 2 has not campaigned.
			if err := n3.Campaign(); !errors.Is(err, ErrNoLogRoom) {
				t.Fatalf("Campaign on node 3 with room for a quarter of its %d bytes: %v, want ErrNoLogRoom", need, err)
			}
		}
		if st := n3.Status(); st.Role != RoleFollower && !TestingIgnoreLogRoom && !bothShort {
			t.Fatalf("node 3 became %v with room for a quarter of its re-proposals", st.Role)
		}
		if l := nw.leader(); l != 0 && nw.nodes[l].ownCommitted() {
			leader = l
			break
		}
	}
	if leader == 0 || bothShort {
		return leader, n3.Status().ElectionsDeferred, ticks
	}
	nw.tick(3 * n2.cfg.ElectionTicks)
	for _, id := range []NodeID{2, 3} {
		if got := len(nw.cmds(id)); got != k {
			t.Fatalf("node %d applied %d commands after node %d's election, want %d", id, got, leader, k)
		}
	}
	nw.checkAgree()
	if leader == 2 {
		// Caught up, node 3 has nothing above its commit: it may lead again.
		if need := n3.reproposalBytes(1 << 40); need > n3.logRoom {
			t.Fatalf("node 3 still holds %d bytes above its commit after catching up", need)
		}
	}
	return leader, n3.Status().ElectionsDeferred, ticks
}

// TestNoRoomForAdoptedValues: a candidate with nothing above its commit
// index (so it may campaign) whose phase 1 adopts more uncommitted values
// from the promises than its declared log room holds does not take the
// leadership; a member with room does, and the first catches up. Planted
// (TestingIgnoreLogRoom): it leads.
func TestNoRoomForAdoptedValues(t *testing.T) {
	defer func() { TestingIgnoreLogRoom = false }()
	leader, deferred := adoptedElection(t)
	if leader != 2 || deferred == 0 {
		t.Fatalf("leader %d, node 3 deferred %d: want node 2, and node 3 refusing the leadership its promises won", leader, deferred)
	}
	TestingIgnoreLogRoom = true
	if pLeader, _ := adoptedElection(t); pLeader != 3 {
		t.Fatalf("planted (room ignored): leader %d, want node 3, or the test does not show what the rule prevents", pLeader)
	}
	fmt.Printf("log room adopted: leader=2 node3_deferred=%d; planted (room ignored): leader=3\n", deferred)
}

func adoptedElection(t *testing.T) (leader NodeID, deferred uint64) {
	const k, cmdBytes = 40, 1 << 10
	nw := newNetwork(t, 3)
	for nw.leader() != 1 {
		nw.nodes[1].electionElapsed = nw.nodes[1].electionTimeout
		nw.tick(1)
	}
	nw.dropNext = func(m Message) bool { return m.To == 3 } // node 3 holds none of them
	for i := range k {
		nw.propose(1, fmt.Sprintf("%04d%s", i, strings.Repeat("x", cmdBytes)))
	}
	nw.tick(1)
	nw.crash(1)
	nw.dropNext = nil
	n2, n3 := nw.nodes[2], nw.nodes[3]
	room := int64(k*cmdBytes) / 4
	if own := n3.reproposalBytes(1 << 40); own > room/4 {
		t.Fatalf("node 3 holds %d bytes above its commit: the test needs its own entries to fit", own)
	}
	n3.SetLogRoom(room)
	n2.electionTimeout = 1 << 30   // node 2 waits
	nw.tick(n3.cfg.LeaseTicks + 1) // the restart-free leases run out
	n3.campaign()                  // as a transfer target would: no pre-check
	nw.settle()
	if n3.Status().Role == RoleLeader {
		return 3, n3.Status().ElectionsDeferred
	}
	deferred = n3.Status().ElectionsDeferred
	n2.electionElapsed, n2.electionTimeout = 0, n2.cfg.ElectionTicks
	for range 400 {
		n3.electionElapsed = 0 // node 3 stays quiet
		nw.tick(1)
		if l := nw.leader(); l != 0 && nw.nodes[l].ownCommitted() {
			leader = l
			break
		}
	}
	nw.tick(3 * n2.cfg.ElectionTicks)
	if leader != 0 {
		nw.checkAgree()
	}
	return leader, deferred
}
