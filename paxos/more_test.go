package paxos

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func others(nw *network, id NodeID) []NodeID {
	var out []NodeID
	for _, o := range nw.ids {
		if o != id {
			out = append(out, o)
		}
	}
	return out
}

func TestRestartFromDurableState(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.propose(l, "a", "b")
	nw.tick(2)
	f := others(nw, l)[0]
	nw.crash(f)
	nw.propose(l, "c")
	nw.restart(f)
	nw.tick(30)
	if got := nw.cmds(f); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("restarted follower applied %v", got)
	}
	// Restart every node at once: nothing committed may be lost.
	for _, id := range nw.ids {
		nw.crash(id)
	}
	for _, id := range nw.ids {
		nw.restart(id)
	}
	l = nw.elect()
	nw.propose(l, "d")
	nw.tick(3)
	for _, id := range nw.ids {
		if got := nw.cmds(id); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
			t.Fatalf("node %d applied %v", id, got)
		}
	}
	nw.checkAgree()
}

func TestLeaseReadAndExpiry(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.tick(1)
	n := nw.nodes[l]
	if !n.Status().LeaseValid {
		t.Fatal("leader holds no lease after a heartbeat round")
	}
	if err := n.ReadIndex(1); err != nil {
		t.Fatal(err)
	}
	// Served from the lease: answered without any message round.
	if !n.HasReady() {
		t.Fatal("no ready")
	}
	rd := n.Ready()
	if len(rd.ReadStates) != 1 || rd.ReadStates[0].ID != 1 || rd.ReadStates[0].Index != n.commit {
		t.Fatalf("read states %v", rd.ReadStates)
	}
	n.Advance(rd)
	// Cut the leader off: the lease runs out, reads need a barrier that
	// cannot complete.
	nw.isolate(l)
	nw.tick(nw.nodes[l].cfg.LeaseTicks)
	if n.Status().LeaseValid {
		t.Fatal("lease still valid after LeaseTicks without acks")
	}
	if err := n.ReadIndex(2); err != nil && !errors.Is(err, ErrNotLeader) {
		t.Fatal(err)
	}
	nw.settle()
	for _, r := range nw.reads[l] {
		if r.ID == 2 {
			t.Fatal("read answered without a majority")
		}
	}
	// Followers refuse a new leader while the lease they granted runs.
	f := others(nw, l)[0]
	if nw.nodes[f].Status().Role == RoleLeader {
		t.Fatal("follower became leader inside the lease")
	}
}

func TestReadBarrierWithoutLease(t *testing.T) {
	nw := newNetwork(t, 3)
	for _, id := range nw.ids {
		cfg := testConfig(id, nw.ids)
		cfg.LeaseTicks, cfg.DriftTicks = 0, 0
		nw.start(id, cfg)
	}
	l := nw.elect()
	nw.propose(l, "a")
	if err := nw.nodes[l].ReadIndex(9); err != nil {
		t.Fatal(err)
	}
	nw.settle()
	rs := nw.reads[l]
	if len(rs) != 1 || rs[0].ID != 9 || rs[0].Index < 2 {
		t.Fatalf("read states %v", rs)
	}
	if err := nw.nodes[others(nw, l)[0]].ReadIndex(3); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("follower ReadIndex: %v", err)
	}
}

func TestCompactAndSnapshotCatchup(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	f := others(nw, l)[0]
	nw.crash(f)
	for i := range 20 {
		nw.propose(l, fmt.Sprint(i))
	}
	n := nw.nodes[l]
	applied := n.Status().Applied
	if err := nw.compact(l, []byte("state")); err != nil {
		t.Fatal(err)
	}
	if st := n.Status(); st.FirstSlot != applied+1 {
		t.Fatalf("first slot %d after compact through %d", st.FirstSlot, applied)
	}
	nw.propose(l, "after")
	nw.restart(f)
	nw.tick(30)
	if s := nw.snaps[f]; s == nil || string(s.Data) != "state" || s.Meta.Slot != applied {
		t.Fatalf("snapshot not installed on %d: %+v", f, s)
	}
	if got := nw.cmds(f); !slices.Equal(got, []string{"after"}) {
		t.Fatalf("after snapshot applied %v", got)
	}
	if st := nw.nodes[f].Status(); st.Commit != n.Status().Commit || st.FirstSlot != applied+1 {
		t.Fatalf("follower status %+v", st)
	}
}

func TestMembershipAddRemove(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.propose(l, "a")
	// Add node 4, started with the initial membership: it learns the rest
	// from the log.
	if err := nw.nodes[l].ProposeConfChange(ConfChange{Type: ConfAddNode, Node: 4}); err != nil {
		t.Fatal(err)
	}
	if err := nw.nodes[l].ProposeConfChange(ConfChange{Type: ConfRemoveNode, Node: 2}); !errors.Is(err, ErrConfChangeBusy) {
		t.Fatalf("second change: %v", err)
	}
	nw.start(4, testConfig(4, []NodeID{1, 2, 3}))
	nw.settle()
	nw.tick(5)
	if m := nw.nodes[l].Status().Members; !slices.Equal(m, []NodeID{1, 2, 3, 4}) {
		t.Fatalf("members %v", m)
	}
	nw.propose(l, "b")
	nw.tick(5)
	if got := nw.cmds(4); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("new node applied %v", got)
	}
	if m := nw.nodes[4].Status().Members; !slices.Equal(m, []NodeID{1, 2, 3, 4}) {
		t.Fatalf("new node members %v", m)
	}
	// With 4 members the quorum is 3: losing two stalls commits.
	victim := others(nw, l)[0]
	if err := nw.nodes[l].ProposeConfChange(ConfChange{Type: ConfRemoveNode, Node: victim}); err != nil {
		t.Fatal(err)
	}
	nw.settle()
	nw.tick(3)
	nw.crash(victim)
	if m := nw.nodes[l].Status().Members; slices.Contains(m, victim) || len(m) != 3 {
		t.Fatalf("members after removal %v", m)
	}
	nw.propose(l, "c")
	nw.tick(3)
	for _, id := range nw.ids {
		if id == victim {
			continue
		}
		if got := nw.cmds(id); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Fatalf("node %d applied %v", id, got)
		}
	}
	nw.checkAgree()
	// Removing the leader itself: it steps down and the rest elect anew.
	if err := nw.nodes[l].ProposeConfChange(ConfChange{Type: ConfRemoveNode, Node: l}); err != nil {
		t.Fatal(err)
	}
	nw.settle()
	nw.tick(60)
	l2 := nw.leader()
	if l2 == 0 || l2 == l {
		t.Fatalf("leader after removing %d: %d", l, l2)
	}
	nw.propose(l2, "d")
	nw.tick(3)
	if got := nw.cmds(l2); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Fatalf("node %d applied %v", l2, got)
	}
}

func TestBadMessagesDropped(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	n := nw.nodes[l]
	f := others(nw, l)[0]
	bad := []Message{
		{Type: MsgAccepted, Cluster: 99, From: f, To: l, Ballot: n.lead.ballot, Slot: 1, Index: 1},
		{Type: MsgAccepted, Cluster: 7, From: 42, To: l, Ballot: n.lead.ballot, Slot: 1, Index: 1},
		{Type: MsgAccept, Cluster: 7, From: f, To: l, Ballot: Ballot{Round: 9, Node: l}},
		{Type: MsgAccept, Cluster: 7, From: f, To: l, Ballot: Ballot{Round: 9, Node: f},
			Entries: []Entry{{Slot: 1 << 40, Ballot: Ballot{Round: 9, Node: f}, Type: EntryNormal}}},
		{Type: MsgAccepted, Cluster: 7, From: f, To: l, Ballot: n.lead.ballot, Slot: 5, Index: 2},
		{Type: MsgType(77), Cluster: 7, From: f, To: l},
		{Type: MsgPrepare, Cluster: 7, From: f, To: l, Ballot: Ballot{Round: 1 << 63, Node: f}, Slot: 1},
		{Type: MsgSnapshot, Cluster: 7, From: f, To: l, Ballot: Ballot{Round: 9, Node: f}},
	}
	for i, m := range bad {
		if err := n.Step(m); !errors.Is(err, ErrBadMessage) {
			t.Fatalf("bad message %d: err %v", i, err)
		}
	}
	if d := n.Status().Dropped; d != uint64(len(bad)) {
		t.Fatalf("dropped %d, want %d", d, len(bad))
	}
	if nw.leader() != l {
		t.Fatal("bad messages changed the leader")
	}
}

func TestAckEventsMatchCommits(t *testing.T) {
	nw := newNetwork(t, 5)
	l := nw.elect()
	nw.acks[l] = nil
	for i := range 10 {
		nw.propose(l, fmt.Sprint(i))
	}
	nw.tick(2)
	committed := map[Slot]int{}
	for _, ev := range nw.acks[l] {
		if ev.Committed {
			committed[ev.Slot]++
			if ev.Count != 3 {
				t.Fatalf("commit event with count %d", ev.Count)
			}
		}
	}
	if len(committed) != 10 {
		t.Fatalf("%d commit events, want 10", len(committed))
	}
	for s, c := range committed {
		if c != 1 {
			t.Fatalf("slot %d committed %d times", s, c)
		}
		if b, k := nw.nodes[l].AckCount(s); k != 5 || b != nw.nodes[l].lead.ballot {
			t.Fatalf("AckCount(%d) = %v, %d", s, b, k)
		}
	}
}

func TestDuplicatesAndDropsHarmless(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	k := 0
	nw.dropNext = func(m Message) bool { k++; return k%3 == 0 }
	for i := range 30 {
		_ = nw.nodes[l].Propose([][]byte{[]byte(fmt.Sprint(i))})
		nw.settle()
		// Duplicate every Accept once by replaying the leader's log range.
		nw.tick(1)
	}
	nw.dropNext = nil
	nw.tick(30)
	want := nw.cmds(nw.leader())
	if len(want) == 0 {
		t.Fatal("nothing committed")
	}
	for _, id := range nw.ids {
		if got := nw.cmds(id); !slices.Equal(got, want) {
			t.Fatalf("node %d applied %v, leader %v", id, got, want)
		}
	}
	nw.checkAgree()
}

// TestChunkedPromise elects a node whose log is far behind: the promises it
// collects exceed EntriesPerMessageMax and arrive in chunks. It campaigns
// as a transfer's target does, without the pre-check, which the node that
// committed further would refuse.
func TestChunkedPromise(t *testing.T) {
	nw := newNetwork(t, 3)
	l := NodeID(1)
	for nw.leader() != l {
		nw.nodes[l].electionElapsed = nw.nodes[l].electionTimeout
		nw.tick(1)
	}
	nw.crash(3)
	const k = EntriesPerMessageMax + 500
	for i := range k {
		if err := nw.nodes[l].Propose([][]byte{[]byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
		nw.settle()
	}
	nw.tick(1)
	nw.crash(l)
	nw.restart(3)
	// Let leases and the memory of leader 1 run out, then make 3 campaign.
	for range 30 {
		nw.nodes[2].electionElapsed = 0
		nw.nodes[3].electionElapsed = 0
		nw.tick(1)
	}
	nw.nodes[3].campaign()
	nw.tick(3)
	if nw.leader() != 3 {
		t.Fatalf("leader %d, want 3", nw.leader())
	}
	nw.tick(5)
	got := nw.cmds(3)
	if len(got) != k || got[k-1] != fmt.Sprint(k-1) {
		t.Fatalf("node 3 applied %d commands, want %d", len(got), k)
	}
	nw.checkAgree()
}

// TestSnapshotOfferedToLaggingCandidate: a node below every peer's
// compaction point cannot pre-check or prepare; the peer that refuses it
// sends its snapshot, so it catches up without a leader.
func TestSnapshotOfferedToLaggingCandidate(t *testing.T) {
	nw := newNetwork(t, 3)
	for nw.leader() != 1 {
		nw.nodes[1].electionElapsed = nw.nodes[1].electionTimeout
		nw.tick(1)
	}
	nw.crash(3)
	for i := range 10 {
		nw.propose(1, fmt.Sprint(i))
	}
	nw.tick(2)
	for _, id := range []NodeID{1, 2} {
		if err := nw.compact(id, []byte("s")); err != nil {
			t.Fatal(err)
		}
	}
	nw.crash(1)
	nw.restart(3)
	for range 60 {
		nw.nodes[2].electionElapsed = 0 // node 2 never campaigns
		nw.tick(1)
		if nw.snaps[3] != nil {
			break
		}
	}
	if nw.snaps[3] == nil {
		t.Fatal("lagging node 3 got no snapshot")
	}
	if nw.leader() != 0 {
		t.Fatalf("leader %d exists; the test wants the leaderless path", nw.leader())
	}
	if st := nw.nodes[3].Status(); st.Commit != nw.nodes[2].Status().Commit {
		t.Fatalf("node 3 commit %d, node 2 %d", st.Commit, nw.nodes[2].Status().Commit)
	}
	l := nw.elect()
	nw.propose(l, "after")
	nw.tick(3)
	nw.checkAgree()
}

// TestRefusalWithUnknownBallotNode: a refusal carries the refuser's promised
// ballot, which may belong to a node this one never heard of (removed and
// compacted away). It is an ordering fact, not bad input: the next campaign
// must outbid it.
func TestRefusalWithUnknownBallotNode(t *testing.T) {
	n, err := NewNode(testConfig(1, []NodeID{1, 2, 3}), DurableState{})
	if err != nil {
		t.Fatal(err)
	}
	for range 40 {
		n.Tick()
	}
	err = n.Step(Message{Type: MsgPromise, Cluster: 7, From: 2, To: 1, Ballot: Ballot{Round: 50, Node: 9}, Slot: 1, Reject: true})
	if err != nil {
		t.Fatalf("refusal dropped: %v", err)
	}
	n.campaign()
	if b := n.Status().Ballot; b.Round <= 50 {
		t.Fatalf("campaign ballot %v does not outbid round 50", b)
	}
}

func TestExternalElection(t *testing.T) {
	nw := newNetwork(t, 3)
	for _, id := range nw.ids {
		cfg := testConfig(id, nw.ids)
		cfg.ExternalElection = true
		nw.start(id, cfg)
	}
	nw.tick(100)
	if l := nw.leader(); l != 0 {
		t.Fatalf("node %d elected itself without Campaign", l)
	}
	if err := nw.nodes[2].Campaign(); err != nil {
		t.Fatal(err)
	}
	nw.settle()
	if l := nw.leader(); l != 2 {
		t.Fatalf("leader %d after Campaign on 2", l)
	}
	nw.tick(1)
	// Node 3 acked a heartbeat: its lease to node 2 forbids campaigning.
	if err := nw.nodes[3].Campaign(); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("Campaign inside a lease: %v", err)
	}
	// The plane handles heartbeats: cut node 2's own heartbeats to 3 and
	// report contact instead; node 3 keeps honouring the lease.
	nw.cut[[2]NodeID{2, 3}] = true
	for range 20 {
		nw.nodes[3].NoteLeaderContact(2)
		nw.tick(1)
		if err := nw.nodes[3].Campaign(); !errors.Is(err, ErrLeaseHeld) {
			t.Fatalf("Campaign while the plane reports the leader: %v", err)
		}
	}
	if st := nw.nodes[3].Status(); st.Leader != 2 {
		t.Fatalf("node 3 follows %d", st.Leader)
	}
}

// TestRetransmitBacksOff: an Accept still unacknowledged is sent again, but
// not at every heartbeat: its interval doubles per resend, up to half an
// election timeout, so a large entry in flight is not re-sent (and
// re-persisted by its acceptor) while it is still on its way.
func TestRetransmitBacksOff(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	f := others(nw, l)[0]
	sent := 0
	nw.dropNext = func(m Message) bool {
		if m.Type != MsgAccept {
			return false
		}
		if m.To == f {
			sent++
		}
		return true // no Accept arrives: the slot stays unacknowledged
	}
	nw.propose(l, "x")
	const ticks = 40 // HeartbeatTicks 1, ElectionTicks 10: intervals 1, 2, 4, then 5
	nw.tick(ticks)
	if nw.nodes[l].Status().Role != RoleLeader {
		t.Fatal("the leader stepped down; heartbeats were not dropped")
	}
	// First send, then resends after 1, 2, 4 and every 5 ticks: about 10.
	if sent < 5 || sent > 12 {
		t.Fatalf("the unacknowledged Accept went to node %d %d times in %d heartbeats, want 5..12", f, sent, ticks)
	}
	t.Logf("unacknowledged Accept sent %d times in %d heartbeats", sent, ticks)
}

// TestRoundJumpBounded walks the round-jump bound: a Prepare whose round is
// RoundJumpMax above the highest seen is stepped, one round more is dropped
// as bad input and changes nothing (a forged Prepare with round 2^62-1 once
// left every node a candidate forever, even across restarts).
func TestRoundJumpBounded(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	f := others(nw, l)[0]
	n := nw.nodes[f]
	top := n.maxRound
	before := n.Status().Promised
	over := Message{Type: MsgPrepare, Cluster: 7, From: l, To: f, Ballot: Ballot{Round: top + RoundJumpMax + 1, Node: l}, Slot: 1}
	if err := n.Step(over); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("a round %d above the highest seen: %v", RoundJumpMax+1, err)
	}
	if n.Status().Promised != before {
		t.Fatal("a dropped Prepare changed the promise")
	}
	at := over
	at.Ballot.Round = top + RoundJumpMax
	if err := n.Step(at); err != nil {
		t.Fatalf("a round exactly RoundJumpMax above: %v", err)
	}
	if n.Status().Promised != at.Ballot {
		t.Fatalf("promised %v, want %v", n.Status().Promised, at.Ballot)
	}
}

// TestElapseFiresEachTimerOnce: Elapse(k) moves the clock by k (leases
// expire as for k ticks) but sends one heartbeat round and counts at most
// LivenessTicksPerElapseMax toward check quorum, so a leader whose loop
// stalled keeps leading; cut off for real, it still steps down.
func TestElapseFiresEachTimerOnce(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.tick(1)
	n := nw.nodes[l]
	if !n.Status().LeaseValid {
		t.Fatal("no lease after a heartbeat round")
	}
	before := n.now
	n.Elapse(5 * n.cfg.ElectionTicks)
	if n.now != before+int64(5*n.cfg.ElectionTicks) {
		t.Fatalf("clock moved to %d, want %d", n.now, before+int64(5*n.cfg.ElectionTicks))
	}
	if n.Status().Role != RoleLeader {
		t.Fatal("a leader whose peers were active stepped down after one stretch")
	}
	if n.Status().LeaseValid {
		t.Fatal("the lease survived five election timeouts of clock")
	}
	rd := n.Ready()
	heartbeats := 0
	for _, m := range rd.Messages {
		if m.Type == MsgHeartbeat {
			heartbeats++
		}
	}
	if heartbeats != len(nw.ids)-1 {
		t.Fatalf("%d heartbeats after the stretch, want one round (%d)", heartbeats, len(nw.ids)-1)
	}
	n.Advance(rd)
	// Cut off for real: a loop that keeps stalling for whole election
	// timeouts still steps down, after at most one check window counted
	// at the capped rate (plus the window already begun).
	nw.isolate(l)
	calls, bound := 0, 2*n.cfg.ElectionTicks/LivenessTicksPerElapseMax(n.cfg)+1
	for n.Status().Role == RoleLeader && calls < bound {
		n.Elapse(n.cfg.ElectionTicks)
		calls++
	}
	if n.Status().Role == RoleLeader {
		t.Fatalf("a leader that heard from nobody for %d stalls of an election timeout kept leading", calls)
	}
	if calls == 1 {
		t.Fatal("one stretch decided check quorum: the stall itself was judged")
	}
}

// TestElapseStallIsNotSilence: a leader's and a follower's loops each stall
// for several election timeouts while the other side kept sending (the
// answers wait in the queue). Stepping them after the stall keeps the
// leader leading and the follower following: neither judges its peers by
// time it did not run.
func TestElapseStallIsNotSilence(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.tick(1)
	ballot := nw.nodes[l].Status().Promised
	for _, id := range nw.ids {
		n := nw.nodes[id]
		// The stretch just past a check window or an election timeout,
		// wherever the node's timers stood.
		n.Elapse(3 * n.cfg.ElectionTicks)
		if id == l && n.Status().Role != RoleLeader {
			t.Fatalf("leader %d stepped down on its own stall", id)
		}
		for _, m := range n.Ready().Messages {
			if m.Type == MsgPreCheck || m.Type == MsgPrepare {
				t.Fatalf("node %d campaigned on its own stall: %v", id, m.Type)
			}
		}
		n.Advance(n.Ready())
	}
	nw.settle()
	for range 3 * nw.nodes[l].cfg.ElectionTicks {
		nw.tick(1)
	}
	if got := nw.nodes[l].Status(); got.Role != RoleLeader || got.Promised != ballot {
		t.Fatalf("after the stalls: leader %d is %v at %v, want leader at %v", l, got.Role, got.Promised, ballot)
	}
}

// TestElapseStarvedFollowerStillCampaigns: liveness under constant
// starvation. The leader is gone and a follower's loop only ever runs
// after a stall of half an election timeout; it still campaigns, within
// the bound Elapse's contract gives (ElectionTimeout counted at the capped
// rate).
func TestElapseStarvedFollowerStillCampaigns(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.tick(1)
	nw.crash(l)
	var f NodeID
	for _, id := range nw.ids {
		if id != l {
			f = id
			break
		}
	}
	n := nw.nodes[f]
	gap := n.cfg.ElectionTicks / 2
	// The randomized timeout is below 2*ElectionTicks; each call counts
	// LivenessTicksPerElapseMax of it.
	bound := 2*n.cfg.ElectionTicks/LivenessTicksPerElapseMax(n.cfg) + 1
	for calls := 0; calls < bound; calls++ {
		n.Elapse(gap)
		rd := n.Ready()
		for _, m := range rd.Messages {
			if m.Type == MsgPreCheck {
				return
			}
		}
		n.Advance(rd)
	}
	t.Fatalf("a starved follower with a dead leader did not campaign within %d stalls of %d ticks", bound, gap)
}
