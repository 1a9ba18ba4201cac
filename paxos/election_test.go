package paxos

import (
	"fmt"
	"testing"
)

// TestLaggingNodeDoesNotHoldElections: the livelock an outside check saw
// (8 s without a leader while a follower fetching a 314 MB snapshot
// campaigned from round 3 to 29), reduced. The leader dies while node 3
// lags 60 slots behind node 2, and node 3's phase 1 cannot finish (its
// promises are lost: the chunks of a far-behind candidate outlasting its
// election timeout on a loaded machine); node 3's timer always fires
// first. Node 2 refuses node 3's pre-check because it committed further,
// so node 2 campaigns and leads with everything committed. With the rule
// planted away node 3 re-campaigns under ever higher ballots, node 2
// promises each and restarts its own timer, and nobody leads.
func TestLaggingNodeDoesNotHoldElections(t *testing.T) {
	defer func() { TestingPreCheckIgnoresCommit = false }()
	leader, ticks, campaigns, refusals := laggingElection(t)
	if leader != 2 {
		t.Fatalf("leader %d after %d ticks (node 3 campaigned %d times), want node 2, which committed furthest", leader, ticks, campaigns)
	}
	if refusals == 0 {
		t.Fatalf("node 3's pre-checks were refused (it never campaigned) but Status.PreCheckRefusals is 0")
	}
	TestingPreCheckIgnoresCommit = true
	pLeader, pTicks, pCampaigns, _ := laggingElection(t)
	if pLeader != 0 || pCampaigns < 10 {
		t.Fatalf("planted (a pre-check that ignores commit): leader %d after %d ticks, node 3 campaigned %d times: want no leader and a campaigning node 3, or the test does not show the livelock", pLeader, pTicks, pCampaigns)
	}
	fmt.Printf("lagging candidate: leader=%d after %d ticks, node 3 campaigned %d times (pre-checks refused %d); planted (pre-check ignores commit): no leader in %d ticks, node 3 campaigned %d times\n",
		leader, ticks, campaigns, refusals, pTicks, pCampaigns)
}

// laggingElection runs the scenario of TestLaggingNodeDoesNotHoldElections
// for at most 400 ticks after the leader dies: the leader then, the ticks
// it took, and how many times node 3 ran phase 1.
func laggingElection(t *testing.T) (leader NodeID, ticks, campaigns int, refusals uint64) {
	nw := newNetwork(t, 3)
	for nw.leader() != 1 {
		nw.nodes[1].electionElapsed = nw.nodes[1].electionTimeout
		nw.tick(1)
	}
	// Node 3 receives nothing that would let it commit.
	nw.dropNext = func(m Message) bool {
		return m.To == 3 && (m.Type == MsgAccept || m.Type == MsgCatchup || m.Type == MsgSnapshot)
	}
	const k = 60
	for i := range k {
		nw.propose(1, fmt.Sprint(i))
	}
	nw.tick(1)
	if c2, c3 := nw.nodes[2].Status().Commit, nw.nodes[3].Status().Commit; c2 < k || c3 >= c2 {
		t.Fatalf("commit: node 2 at %d, node 3 at %d: want node 3 behind", c2, c3)
	}
	nw.crash(1)
	// Node 3's phase 1 never completes; it may catch up from a new leader.
	nw.dropNext = func(m Message) bool { return m.To == 3 && m.Type == MsgPromise }
	n2, n3 := nw.nodes[2], nw.nodes[3]
	last := n3.Status().Promised
	for ticks = 1; ticks <= 400; ticks++ {
		// Node 3's timer is the shortest, node 2's the longest.
		n3.electionTimeout = n3.cfg.ElectionTicks
		n2.electionTimeout = 2*n2.cfg.ElectionTicks - 1
		nw.tick(1)
		if st := n3.Status(); st.Role == RoleCandidate && st.Ballot != last {
			last = st.Ballot
			campaigns++
		}
		if l := nw.leader(); l != 0 && nw.nodes[l].ownCommitted() {
			if got := len(nw.cmds(l)); got != k {
				t.Fatalf("leader %d applied %d commands, want %d", l, got, k)
			}
			return l, ticks, campaigns, n3.Status().PreCheckRefusals
		}
	}
	return 0, ticks - 1, campaigns, n3.Status().PreCheckRefusals
}

// TestPrepareBelowCompactionDoesNotCapture: an acceptor that compacted
// slots a candidate has not committed refuses its Prepare without
// promising it: its promise, role and election timer stay as they were,
// so a candidate that cannot win there does not hold back the acceptor's
// own campaign (it is offered a snapshot instead).
func TestPrepareBelowCompactionDoesNotCapture(t *testing.T) {
	nw := newNetwork(t, 3)
	for nw.leader() != 1 {
		nw.nodes[1].electionElapsed = nw.nodes[1].electionTimeout
		nw.tick(1)
	}
	nw.dropNext = func(m Message) bool { return m.To == 3 }
	for i := range 20 {
		nw.propose(1, fmt.Sprint(i))
	}
	nw.tick(1)
	nw.crash(1)
	nw.tick(3 * nw.nodes[2].cfg.ElectionTicks / 2) // leases run out; node 2 does not campaign yet
	n2 := nw.nodes[2]
	n2.electionElapsed, n2.electionTimeout = 0, 1000
	if err := nw.compact(2, []byte("snap")); err != nil {
		t.Fatal(err)
	}
	before := n2.Status()
	if before.FirstSlot <= nw.nodes[3].Status().Commit+1 {
		t.Fatalf("node 2's log starts at %d, node 3 committed %d: want node 3 below it", before.FirstSlot, nw.nodes[3].Status().Commit)
	}
	nw.dropNext = func(m Message) bool { return m.To == 3 && m.Type == MsgSnapshot }
	elapsed := n2.electionElapsed
	nw.nodes[3].campaign()
	nw.settle()
	after := n2.Status()
	if after.Promised != before.Promised || after.Role != before.Role || n2.electionElapsed != elapsed {
		t.Fatalf("node 2 refused a Prepare from below its log but went from promised %v %v (timer %d) to %v %v (timer %d)",
			before.Promised, before.Role, elapsed, after.Promised, after.Role, n2.electionElapsed)
	}
	if nw.nodes[3].Status().Role == RoleLeader {
		t.Fatal("node 3 leads without the slots it never saw")
	}
}

// TestRemovedNodeGrantsLaggingPreCheck: a leader that commits its own
// removal steps down knowing slots the remaining members may not know
// committed; it must not refuse their pre-checks for lagging behind it
// (election.go, handlePreCheck), or they cannot elect until it compacts. A
// voter ahead of the asking node still refuses.
func TestRemovedNodeGrantsLaggingPreCheck(t *testing.T) {
	nw := newNetwork(t, 3)
	for nw.leader() != 1 {
		nw.nodes[1].electionElapsed = nw.nodes[1].electionTimeout
		nw.tick(1)
	}
	if err := nw.nodes[1].ProposeConfChange(ConfChange{Type: ConfRemoveNode, Node: 1}); err != nil {
		t.Fatal(err)
	}
	nw.settle()
	n1 := nw.nodes[1]
	if n1.isVoter() || n1.role == RoleLeader {
		t.Fatalf("node 1 after its removal: voter %v, role %v", n1.isVoter(), n1.role)
	}
	ask := func(n *Node) bool {
		n.lastLeaderTick = n.now - int64(n.cfg.ElectionTicks) // heard from no leader
		n.leader = 0
		n.msgs = nil
		n.handlePreCheck(&Message{Type: MsgPreCheck, From: 3, To: n.id, Commit: n.commit - 1})
		for _, m := range n.msgs {
			if m.Type == MsgPreCheckResp {
				return !m.Reject
			}
		}
		t.Fatalf("node %d sent no pre-check answer", n.id)
		return false
	}
	nw.nodes[1].leaseUntil, nw.nodes[2].leaseUntil = 0, 0
	if !ask(n1) {
		t.Fatalf("removed node 1 (commit %d) refused a pre-check from a node at %d", n1.commit, n1.commit-1)
	}
	if ask(nw.nodes[2]) {
		t.Fatalf("voter node 2 (commit %d) granted a pre-check from a node at %d", nw.nodes[2].commit, nw.nodes[2].commit-1)
	}
}
