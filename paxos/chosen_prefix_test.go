package paxos

import (
	"fmt"
	"strings"
	"testing"
)

// TestChosenNotReproposed: a leader dies having committed k entries that
// node 2 knows committed and node 3 accepted with a hole at slot holeSlot
// (so its commit index stops below it). Whichever survivor leads, no value
// the promises report committed is stored again: the one that leads
// commits them under the ballot they were accepted under (chosen_prefix.go)
// and a follower holding them catches up without storing them again
// (handleCatchup). Node 3 then stores only the hole's value and what is
// left to re-propose; planted (TestingReproposeChosen): every entry from
// the hole on, again.
func TestChosenNotReproposed(t *testing.T) {
	defer func() { TestingReproposeChosen = false }()
	for _, leads := range []NodeID{3, 2} {
		stored, commit, bal := chosenElection(t, leads)
		TestingReproposeChosen = true
		pStored, pCommit, _ := chosenElection(t, leads)
		TestingReproposeChosen = false
		if stored > 4 || commit < chosenK || bal != (Ballot{Round: 1, Node: 1}) {
			t.Fatalf("node %d leads: node 3 stored %d entries, committed %d, slot %d's ballot %v: want at most 4 (the hole, what was not reported committed, the noop), >= %d, 1.1",
				leads, stored, commit, chosenK, bal, chosenK)
		}
		if pStored < chosenK-holeSlot || pCommit < chosenK {
			t.Fatalf("planted (re-proposed): node %d leads: node 3 stored %d, committed %d: want >= %d stored, or the test does not show the copies", leads, pStored, pCommit, chosenK-holeSlot)
		}
		fmt.Printf("chosen not re-proposed: node %d leads: node 3 stored=%d commit=%d; planted (re-proposed): stored=%d commit=%d\n",
			leads, stored, commit, pStored, pCommit)
	}
}

const (
	chosenK  = 40 // entries the first leader proposes
	holeSlot = 5  // the slot whose Accept node 3 never gets
)

// chosenElection runs the scenario of TestChosenNotReproposed with leads
// campaigning after node 1 dies; it returns the entries node 3 stored from
// then on, node 3's commit index at the end, and the ballot node 3 holds
// chosenK under.
func chosenElection(t *testing.T, leads NodeID) (stored int, commit Slot, bal Ballot) {
	nw := newNetwork(t, 3)
	for nw.leader() != 1 {
		nw.nodes[1].electionElapsed = nw.nodes[1].electionTimeout
		nw.tick(1)
	}
	nw.dropNext = func(m Message) bool {
		if m.Type != MsgAccept || m.To != 3 {
			return false
		}
		for _, e := range m.Entries {
			if e.Slot == holeSlot {
				return true
			}
		}
		return false
	}
	for i := range chosenK {
		nw.propose(1, fmt.Sprintf("%04d%s", i, strings.Repeat("x", 64)))
	}
	nw.dropNext = nil
	n2, n3 := nw.nodes[2], nw.nodes[3]
	if n3.commit >= holeSlot || n2.commit < chosenK {
		t.Fatalf("before the election: node 2 committed %d, node 3 %d: want node 3 below the hole at %d, node 2 at %d or more", n2.commit, n3.commit, holeSlot, chosenK)
	}
	nw.crash(1)
	// Let the lease node 1 held run out, with no election meanwhile.
	for range testConfig(1, nil).LeaseTicks + 2 {
		n2.electionElapsed, n3.electionElapsed = 0, 0
		nw.tick(1)
	}
	before := nw.stored[3]
	nw.nodes[leads].campaign()
	nw.settle()
	for range 30 {
		nw.tick(1)
	}
	if nw.leader() != leads {
		t.Fatalf("leader %d, want %d", nw.leader(), leads)
	}
	return nw.stored[3] - before, n3.commit, n3.log.get(chosenK).Ballot
}
