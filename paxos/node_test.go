package paxos

import (
	"slices"
	"testing"
)

func TestElectAndCommit3(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.propose(l, "a", "b")
	nw.propose(l, "c")
	nw.tick(2)
	for _, id := range nw.ids {
		if got := nw.cmds(id); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Fatalf("node %d applied %v", id, got)
		}
	}
	nw.checkAgree()
}

func TestSingleNode(t *testing.T) {
	nw := newNetwork(t, 1)
	l := nw.elect()
	nw.propose(l, "x")
	if got := nw.cmds(1); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("applied %v", got)
	}
}

func TestLeaderFailover(t *testing.T) {
	nw := newNetwork(t, 5)
	l := nw.elect()
	nw.propose(l, "a")
	nw.isolate(l)
	nw.propose(l, "lost?") // may or may not commit later; must not diverge
	nw.tick(40)
	l2 := nw.leader()
	if l2 == 0 || l2 == l {
		t.Fatalf("no new leader: %d (old %d)", l2, l)
	}
	nw.propose(l2, "b")
	nw.heal()
	nw.tick(30)
	nw.checkAgree()
	for _, id := range nw.ids {
		got := nw.cmds(id)
		if len(got) < 2 || got[0] != "a" || got[len(got)-1] != "b" {
			t.Fatalf("node %d applied %v", id, got)
		}
	}
}

func TestRejoinDoesNotDepose(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	var f NodeID
	for _, id := range nw.ids {
		if id != l {
			f = id
			break
		}
	}
	b := nw.nodes[l].Status().Ballot
	nw.isolate(f)
	nw.tick(100) // f's election timer fires again and again
	nw.heal()
	nw.tick(30)
	if nw.leader() != l || nw.nodes[l].Status().Ballot != b {
		t.Fatalf("leader changed: now %d %v, was %d %v", nw.leader(), nw.nodes[nw.leader()].Status().Ballot, l, b)
	}
	nw.propose(l, "z")
	nw.tick(2)
	if got := nw.cmds(f); len(got) != 1 || got[0] != "z" {
		t.Fatalf("rejoined node applied %v", got)
	}
}
