package paxos

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"testing"
)

func TestConfChangeEncoding(t *testing.T) {
	for _, cc := range []ConfChange{
		{Type: ConfAddNode, Node: 4},
		{Type: ConfRemoveNode, Node: 5},
		{Type: ConfAddLearner, Node: 6, Context: []byte("addresses")},
		{Type: ConfPromote, Node: 6, Context: bytes.Repeat([]byte{7}, ConfChangeContextBytesMax)},
	} {
		got, err := DecodeConfChange(EncodeConfChange(cc))
		if err != nil || !reflect.DeepEqual(got, cc) {
			t.Fatalf("%+v: round trip %+v, %v", cc.Type, got, err)
		}
	}
	// Version 1 entries (written before learners) still decode.
	if got, err := DecodeConfChange([]byte{1, 2, 5, 0, 0, 0, 0, 0, 0, 0}); err != nil || !reflect.DeepEqual(got, ConfChange{Type: ConfRemoveNode, Node: 5}) {
		t.Fatalf("version 1: %+v, %v", got, err)
	}
	good := EncodeConfChange(ConfChange{Type: ConfAddLearner, Node: 6, Context: []byte("ctx")})
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for name, b := range map[string][]byte{
		"empty":             nil,
		"unknown version":   edit(func(b []byte) []byte { b[0] = 3; return b }),
		"v1 learner type":   {1, 3, 5, 0, 0, 0, 0, 0, 0, 0},
		"v1 long":           {1, 2, 5, 0, 0, 0, 0, 0, 0, 0, 0},
		"unknown type":      edit(func(b []byte) []byte { b[1] = 5; return b }),
		"type zero":         edit(func(b []byte) []byte { b[1] = 0; return b }),
		"node zero":         EncodeConfChange(ConfChange{Type: ConfAddNode}),
		"short head":        good[:9],
		"context truncated": good[:len(good)-1],
		"context trailing":  append(bytes.Clone(good), 0),
		"context too large": EncodeConfChange(ConfChange{Type: ConfAddLearner, Node: 6, Context: make([]byte, ConfChangeContextBytesMax+1)}),
	} {
		if cc, err := DecodeConfChange(b); err == nil {
			t.Errorf("%s: decoded %+v", name, cc)
		}
	}
}

func FuzzDecodeConfChange(f *testing.F) {
	f.Add(EncodeConfChange(ConfChange{Type: ConfAddLearner, Node: 6, Context: []byte("ctx")}))
	f.Add([]byte{1, 2, 5, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		cc, err := DecodeConfChange(b)
		if err != nil {
			return
		}
		if b[0] == confChangeVersion && !bytes.Equal(EncodeConfChange(cc), b) {
			t.Fatalf("%+v re-encodes differently", cc)
		}
	})
}

func TestApplyConfChangeRules(t *testing.T) {
	v, l := []NodeID{1, 2, 3}, []NodeID{5}
	for _, c := range []struct {
		cc     ConfChange
		voters []NodeID
		learns []NodeID
		ok     bool
	}{
		{ConfChange{Type: ConfAddLearner, Node: 4}, []NodeID{1, 2, 3}, []NodeID{4, 5}, true},
		{ConfChange{Type: ConfAddNode, Node: 4}, []NodeID{1, 2, 3, 4}, []NodeID{5}, true},
		{ConfChange{Type: ConfPromote, Node: 5}, []NodeID{1, 2, 3, 5}, nil, true},
		{ConfChange{Type: ConfRemoveNode, Node: 5}, []NodeID{1, 2, 3}, nil, true},
		{ConfChange{Type: ConfRemoveNode, Node: 2}, []NodeID{1, 3}, []NodeID{5}, true},
		{ConfChange{Type: ConfAddLearner, Node: 5}, nil, nil, false}, // already a learner
		{ConfChange{Type: ConfAddNode, Node: 5}, nil, nil, false},    // a learner is promoted, not added
		{ConfChange{Type: ConfAddLearner, Node: 1}, nil, nil, false}, // already a voter
		{ConfChange{Type: ConfPromote, Node: 1}, nil, nil, false},    // not a learner
		{ConfChange{Type: ConfPromote, Node: 9}, nil, nil, false},
		{ConfChange{Type: ConfRemoveNode, Node: 9}, nil, nil, false},
	} {
		gv, gl, err := applyConfChange(v, l, c.cc)
		if (err == nil) != c.ok || (c.ok && (!slices.Equal(gv, c.voters) || !slices.Equal(gl, c.learns))) {
			t.Errorf("%+v: %v %v %v", c.cc, gv, gl, err)
		}
	}
	if _, _, err := applyConfChange([]NodeID{1}, nil, ConfChange{Type: ConfRemoveNode, Node: 1}); !errors.Is(err, ErrBadConfChange) {
		t.Errorf("removed the last voter: %v", err)
	}
	if !slices.Equal(v, []NodeID{1, 2, 3}) || !slices.Equal(l, []NodeID{5}) {
		t.Fatal("applyConfChange modified its arguments")
	}
}

// addLearner starts node id with the initial membership and adds it as a
// learner through leader l.
func addLearner(t *testing.T, nw *network, l, id NodeID) {
	t.Helper()
	nw.start(id, testConfig(id, []NodeID{1, 2, 3}))
	if err := nw.nodes[l].ProposeConfChange(ConfChange{Type: ConfAddLearner, Node: id}); err != nil {
		t.Fatal(err)
	}
	nw.settle()
	// A new node refuses every ballot for LeaseTicks (the restart refusal).
	nw.tick(testConfig(id, nil).LeaseTicks + 2)
	if st := nw.nodes[l].Status(); !slices.Equal(st.Learners, []NodeID{id}) || slices.Contains(st.Members, id) {
		t.Fatalf("after adding learner %d: voters %v learners %v", id, st.Members, st.Learners)
	}
}

// TestLearnerReceivesButDoesNotCount: a learner gets every committed entry,
// but its acks commit nothing, it never campaigns, and it extends no lease.
func TestLearnerReceivesButDoesNotCount(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.propose(l, "a")
	addLearner(t, nw, l, 4)
	nw.propose(l, "b")
	nw.tick(3)
	if got := nw.cmds(4); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("learner applied %v", got)
	}
	if pp := nw.nodes[l].PeerProgress(); len(pp) != 3 || pp[2].ID != 4 || !pp[2].Learner || !pp[2].Tracked {
		t.Fatalf("peer progress %+v", pp)
	}
	// Cut the leader from both other voters: the learner still acks, but
	// nothing commits (quorum 2 of {1,2,3} needs another voter).
	commit := nw.nodes[l].Status().Commit
	for _, id := range others(nw, l) {
		if id != 4 {
			nw.cut[[2]NodeID{l, id}], nw.cut[[2]NodeID{id, l}] = true, true
		}
	}
	nw.propose(l, "c")
	nw.tick(2)
	if c := nw.nodes[l].Status().Commit; c != commit {
		t.Fatalf("a learner's ack committed slot %d (commit was %d)", c, commit)
	}
	// The planted bug counts it.
	TestingLearnerAcksCount = true
	nw.tick(1)
	TestingLearnerAcksCount = false
	if c := nw.nodes[l].Status().Commit; c == commit {
		t.Fatal("TestingLearnerAcksCount did not make the learner's ack count")
	}
	// Isolate the learner for long: it never campaigns.
	nw.heal()
	nw.isolate(4)
	for range 100 {
		nw.tick(1)
		if r := nw.nodes[4].Status().Role; r != RoleFollower {
			t.Fatalf("learner became %v", r)
		}
	}
	if err := nw.nodes[4].Campaign(); !errors.Is(err, ErrNotMember) {
		t.Fatalf("learner Campaign: %v", err)
	}
}

// TestPromoteRefusedWhileBehind: a learner that lags more than
// PromoteLagSlotsMax, or was never heard from, is not promoted; once it
// has caught up it is, and counts.
func TestPromoteRefusedWhileBehind(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	addLearner(t, nw, l, 4)
	nw.isolate(4)
	for i := 0; i < PromoteLagSlotsMax+10; i += 200 {
		cmds := make([]string, 200)
		for j := range cmds {
			cmds[j] = "x"
		}
		nw.propose(l, cmds...)
		nw.settle()
		nw.tick(1) // one slot per round of the pipeline: keep it flowing
	}
	for nw.nodes[l].Status().Commit < PromoteLagSlotsMax+5 {
		nw.propose(l, "y")
		nw.settle()
	}
	err := nw.nodes[l].ProposeConfChange(ConfChange{Type: ConfPromote, Node: 4})
	if !errors.Is(err, ErrLearnerBehind) {
		t.Fatalf("promoting a lagging learner: %v", err)
	}
	nw.heal()
	nw.tick(20)
	if err := nw.nodes[l].ProposeConfChange(ConfChange{Type: ConfPromote, Node: 4}); err != nil {
		t.Fatalf("promoting a caught-up learner: %v", err)
	}
	nw.settle()
	nw.tick(3)
	if st := nw.nodes[l].Status(); !slices.Equal(st.Members, []NodeID{1, 2, 3, 4}) || len(st.Learners) != 0 {
		t.Fatalf("after promotion: voters %v learners %v", st.Members, st.Learners)
	}
	nw.checkAgree()
}

// TestTransferLeadership: the leader hands over to a caught-up voter
// without an election timeout, stops leading (and holding a lease) before
// the target campaigns, and refuses proposals while it hands over.
func TestTransferLeadership(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.propose(l, "a")
	nw.tick(2)
	to := others(nw, l)[0]
	if err := nw.nodes[l].TransferLeadership(9); !errors.Is(err, ErrTransferTarget) {
		t.Fatalf("transfer to a non-voter: %v", err)
	}
	if err := nw.nodes[l].TransferLeadership(to); err != nil {
		t.Fatal(err)
	}
	if st := nw.nodes[l].Status(); st.Transferring != to {
		t.Fatalf("status while transferring: %+v", st)
	}
	if err := nw.nodes[l].Propose([][]byte{[]byte("refused")}); !errors.Is(err, ErrTransferring) {
		t.Fatalf("proposal during the hand-over: %v", err)
	}
	if err := nw.nodes[l].TransferLeadership(to); !errors.Is(err, ErrTransferring) {
		t.Fatalf("second transfer: %v", err)
	}
	ticks := 0
	for ; ticks < nw.cfgElection() && nw.leader() != to; ticks++ {
		nw.tick(1)
	}
	if nw.leader() != to {
		t.Fatalf("leader %d after %d ticks, want %d", nw.leader(), ticks, to)
	}
	if ls := nw.nodes[l].LeaseState(); ls.LeaderUntil != 0 || nw.nodes[l].Status().Role == RoleLeader {
		t.Fatalf("old leader still leads: %+v", ls)
	}
	nw.propose(to, "b")
	nw.tick(3)
	for _, id := range nw.ids {
		if got := nw.cmds(id); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("node %d applied %v", id, got)
		}
	}
	nw.checkAgree()
}

// TestTransferGivesUp: a target that cannot catch up makes the leader give
// up after an election timeout and go on leading.
func TestTransferGivesUp(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	to := others(nw, l)[0]
	nw.isolate(to)
	if err := nw.nodes[l].TransferLeadership(to); err != nil {
		t.Fatal(err)
	}
	nw.tick(nw.cfgElection() + 1)
	st := nw.nodes[l].Status()
	if st.Role != RoleLeader || st.Transferring != 0 {
		t.Fatalf("after giving up: %+v", st)
	}
	nw.propose(l, "after")
	nw.tick(2)
	if got := nw.cmds(l); !slices.Contains(got, "after") {
		t.Fatalf("leader applied %v", got)
	}
}

// TestTransferRetriesLostHandOver: when the MsgTransfer to the target is
// lost, the stepped-down leader resends it and the target still takes over
// within an election timeout.
func TestTransferRetriesLostHandOver(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	to := others(nw, l)[0]
	lost := 0
	nw.dropNext = func(m Message) bool {
		if m.Type == MsgTransfer && m.To == to && lost == 0 {
			lost++
			return true
		}
		return false
	}
	if err := nw.nodes[l].TransferLeadership(to); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < nw.cfgElection() && nw.leader() != to; i++ {
		nw.tick(1)
	}
	if lost != 1 || nw.leader() != to {
		t.Fatalf("lost %d hand-overs; leader %d, want %d", lost, nw.leader(), to)
	}
}

// TestJoinWaitsForSnapshot: a node started with Join stores nothing and
// commits nothing until it installs a snapshot, which gives it the
// membership; then it catches up by entries as a learner.
func TestJoinWaitsForSnapshot(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.propose(l, "a")
	nw.tick(2)
	cfg := testConfig(4, nil)
	cfg.Join = true
	cfg.KnownNodes = []NodeID{1, 2, 3}
	nw.start(4, cfg)
	if !nw.nodes[4].Joining() || len(nw.nodes[4].Status().Members) != 0 {
		t.Fatal("a joining node knows a membership")
	}
	if err := nw.nodes[4].Campaign(); !errors.Is(err, ErrNotMember) {
		t.Fatalf("joining node Campaign: %v", err)
	}
	if err := nw.nodes[l].ProposeConfChange(ConfChange{Type: ConfAddLearner, Node: 4}); err != nil {
		t.Fatal(err)
	}
	nw.settle()
	// Without a snapshot to fetch the joiner stays empty.
	nw.tick(3)
	if st := nw.nodes[4].Status(); st.Commit != 0 || st.LastSlot != 0 {
		t.Fatalf("joining node stored or committed entries: %+v", st)
	}
	if err := nw.compact(l, []byte("state")); err != nil {
		t.Fatal(err)
	}
	nw.propose(l, "b")
	nw.tick(nw.cfgElection() + 2)
	st := nw.nodes[4].Status()
	if nw.nodes[4].Joining() || !slices.Equal(st.Learners, []NodeID{4}) || !slices.Equal(st.Members, []NodeID{1, 2, 3}) {
		t.Fatalf("after the snapshot: joining=%v %+v", nw.nodes[4].Joining(), st)
	}
	if lc := nw.nodes[l].Status().Commit; st.Commit != lc {
		t.Fatalf("joined node at commit %d, leader at %d", st.Commit, lc)
	}
	if snap := nw.snaps[4]; snap == nil || !slices.Equal(snap.Meta.Learners, []NodeID{4}) {
		t.Fatalf("installed snapshot %+v", snap)
	}
}

func (nw *network) cfgElection() int { return 2 * testConfig(1, nil).ElectionTicks }
