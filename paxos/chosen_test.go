package paxos

import (
	"fmt"
	"testing"
)

// TestRestartCommitsChosen: a node restarted with its applied slot far
// behind the entries it holds, and a recorded Chosen slot, commits and
// delivers what it holds through Chosen at once (stopping at a slot it
// lacks), so it neither counts them uncommitted nor needs them again;
// planted (TestingIgnoreChosen): its commit index is its applied slot.
func TestRestartCommitsChosen(t *testing.T) {
	defer func() { TestingIgnoreChosen = false }()
	commit, delivered, holeCommit := restartWithChosen(t)
	if commit != 30 || delivered != 29 || holeCommit != 11 {
		t.Fatalf("after the restart: commit %d, delivered %d entries, with a hole at 12: commit %d; want 30, 29 and 11", commit, delivered, holeCommit)
	}
	TestingIgnoreChosen = true
	pCommit, pDelivered, _ := restartWithChosen(t)
	if pCommit != 1 || pDelivered != 0 {
		t.Fatalf("planted (chosen ignored): commit %d, delivered %d: want 1 and 0, or the test does not show it", pCommit, pDelivered)
	}
	fmt.Printf("restart with chosen: commit=%d delivered=%d hole_commit=%d; planted (chosen ignored): commit=%d\n", commit, delivered, holeCommit, pCommit)
}

// restartWithChosen commits 30 slots on node 3, restarts it with applied 1
// and chosen 30 and returns its commit index and what its first Ready
// delivered; then again with slot 12 missing from its log.
func restartWithChosen(t *testing.T) (commit Slot, delivered int, holeCommit Slot) {
	const k = 30
	nw := newNetwork(t, 3)
	for nw.leader() != 1 {
		nw.nodes[1].electionElapsed = nw.nodes[1].electionTimeout
		nw.tick(1)
	}
	for i := range k - 1 { // slot 1 is the leader's noop
		nw.propose(1, fmt.Sprint(i))
	}
	nw.tick(1)
	if c := nw.nodes[3].Status().Commit; c < k {
		t.Fatalf("node 3 committed %d, want %d", c, k)
	}
	restart := func() *Node {
		nw.crash(3)
		d := nw.durable[3]
		d.applied, d.chosen = 1, k
		n, err := NewNode(nw.nodes[3].cfg, d.state())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := restart()
	commit = n.Status().Commit
	if n.HasReady() {
		delivered = len(n.Ready().Committed)
	}
	delete(nw.durable[3].accepted, 12)
	holeCommit = restart().Status().Commit
	return commit, delivered, holeCommit
}
