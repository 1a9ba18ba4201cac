package paxos

import "testing"

func progressOf(t *testing.T, n *Node, id NodeID) PeerProgress {
	t.Helper()
	for _, p := range n.PeerProgress() {
		if p.ID == id {
			return p
		}
	}
	t.Fatalf("node %d reports no progress for %d", n.id, id)
	return PeerProgress{}
}

// TestPeerProgressLeaderView: the leader knows each follower's commit,
// acked slot and when it last heard from it; a follower knows only when
// it heard from the leader; a follower that stops answering ages and falls
// behind in slots and in time.
func TestPeerProgressLeaderView(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	for i := 0; i < 5; i++ {
		nw.propose(l, "x")
	}
	nw.tick(2)
	ln := nw.nodes[l]
	commit := ln.Status().Commit
	var followers []NodeID
	for _, id := range nw.ids {
		if id != l {
			followers = append(followers, id)
		}
	}
	if got := len(ln.PeerProgress()); got != 2 {
		t.Fatalf("leader reports %d peers, want 2", got)
	}
	for _, id := range followers {
		p := progressOf(t, ln, id)
		if !p.Tracked || !p.Reported || !p.Heard || p.HeardAgoTicks > 1 || p.Commit != commit || p.Acked < commit || p.LagTicks != 0 || p.LagAtLeast {
			t.Fatalf("leader's view of healthy follower %d: %+v (commit %d)", id, p, commit)
		}
	}
	// A follower sees the leader, and nothing it cannot know.
	f := nw.nodes[followers[0]]
	pl := progressOf(t, f, l)
	if !pl.Heard || pl.HeardAgoTicks > 1 || pl.Tracked || pl.Reported || pl.Commit != 0 || pl.Acked != 0 {
		t.Fatalf("follower's view of the leader: %+v", pl)
	}
	if po := progressOf(t, f, followers[1]); po.Heard || po.Tracked {
		t.Fatalf("follower's view of the other follower: %+v", po)
	}

	// The second follower goes down; the group goes on committing.
	down := followers[1]
	nw.crash(down)
	for i := 0; i < 4; i++ {
		nw.propose(l, "y")
		nw.tick(1)
	}
	p := progressOf(t, ln, down)
	if p.HeardAgoTicks < 4 || p.Commit != commit || ln.Status().Commit <= commit {
		t.Fatalf("leader's view of the crashed follower: %+v (leader commit %d)", p, ln.Status().Commit)
	}
	if p.LagTicks < 3 || p.LagTicks > p.HeardAgoTicks+1 {
		t.Fatalf("lag of the crashed follower %d ticks (heard %d ago)", p.LagTicks, p.HeardAgoTicks)
	}
	// Past the heartbeat history the lag is a lower bound.
	nw.tick(hbHistoryMax + 2)
	if p := progressOf(t, ln, down); !p.LagAtLeast || p.LagTicks < hbHistoryMax-1 {
		t.Fatalf("after the history ran out: %+v", p)
	}
	// Back up, it catches up and its lag is gone.
	nw.restart(down)
	nw.tick(3)
	if p := progressOf(t, ln, down); p.Commit != ln.Status().Commit || p.LagTicks != 0 || p.HeardAgoTicks > 1 {
		t.Fatalf("after the restart: %+v (leader commit %d)", p, ln.Status().Commit)
	}
}

// TestHeardBounded: the table of last-heard times never grows past
// heardNodesMax, and senders that are no longer members make room.
func TestHeardBounded(t *testing.T) {
	n, err := NewNode(testConfig(1, []NodeID{1, 2, 3}), DurableState{})
	if err != nil {
		t.Fatal(err)
	}
	for id := NodeID(100); id < 100+3*heardNodesMax; id++ {
		n.noteHeard(id)
	}
	if len(n.heard) > heardNodesMax {
		t.Fatalf("%d senders remembered, bound %d", len(n.heard), heardNodesMax)
	}
	n.noteHeard(2)
	if _, ok := n.heard[2]; !ok {
		t.Fatal("a member was not remembered once outsiders filled the table")
	}
}
