package paxos

import (
	"fmt"
	"testing"
)

// TestRestartedLeaderServesTail: DurableState's committed tail. Node 2
// restarts with its state applied through 31 and its log kept from slot
// 12 (Snapshot at 11, Accepted from 12): it leads, and node 3, which
// missed slots 12-31, catches up from that log, with no snapshot; with
// the log starting above the applied slot (Snapshot at 31, how a restart
// recovered before) node 3 needs a snapshot of the whole state.
func TestRestartedLeaderServesTail(t *testing.T) {
	snaps, commit, delivered := restartWithTail(t, true)
	if snaps != 0 || commit < 32 || delivered != 20 {
		t.Fatalf("with the tail: node 3 installed %d snapshots, commit %d, %d entries delivered from the tail; want 0, >= 32, 20", snaps, commit, delivered)
	}
	pSnaps, pCommit, _ := restartWithTail(t, false)
	if pSnaps != 1 || pCommit < 32 {
		t.Fatalf("without the tail: node 3 installed %d snapshots, commit %d; want 1 (or the test does not show the difference)", pSnaps, pCommit)
	}
	fmt.Printf("restart with tail: snapshots=%d commit=%d delivered_from_tail=%d; without the tail: snapshots=%d\n", snaps, commit, delivered, pSnaps)
}

// restartWithTail commits 11 slots everywhere and 20 more without node 3,
// crashes every node, restarts nodes 2 and 3 (node 2 with its snapshot at
// 11 when tail, at 31 otherwise) and returns the snapshots node 3
// installed, its commit index and how many of slots 12-31 it was
// delivered as entries.
func restartWithTail(t *testing.T, tail bool) (snaps int, commit Slot, delivered int) {
	nw := newNetwork(t, 3)
	for nw.leader() != 1 {
		nw.nodes[1].electionElapsed = nw.nodes[1].electionTimeout
		nw.tick(1)
	}
	for i := range 10 { // slot 1 is the leader's noop
		nw.propose(1, fmt.Sprint("a", i))
	}
	nw.tick(2)
	nw.isolate(3)
	for i := range 20 {
		nw.propose(1, fmt.Sprint("b", i))
	}
	nw.tick(2)
	if c2, c3 := nw.nodes[2].Status().Commit, nw.nodes[3].Status().Commit; c2 != 31 || c3 != 11 {
		t.Fatalf("before the crash: node 2 committed %d, node 3 %d; want 31 and 11", c2, c3)
	}
	snapAt := Slot(31)
	if tail {
		snapAt = 11
	}
	meta, err := nw.nodes[2].SnapshotMetaAt(snapAt)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range nw.ids {
		nw.crash(id)
	}
	d2 := nw.durable[2]
	d2.snap, d2.snapData = &meta, []byte("state at 31")
	if d2.applied != 31 {
		t.Fatalf("node 2 applied %d, want 31", d2.applied)
	}
	nw.heal()
	nw.restart(2)
	nw.restart(3)
	if l := nw.elect(); l != 2 {
		t.Fatalf("node %d leads, want 2 (node 3 is behind)", l)
	}
	nw.tick(30)
	for _, e := range nw.applied[3] {
		if e.Slot >= 12 && e.Slot <= 31 && e.Type == EntryNormal {
			delivered++
		}
	}
	if nw.snaps[3] != nil {
		snaps = 1
	}
	return snaps, nw.nodes[3].Status().Commit, delivered
}
