package paxos

import (
	"fmt"
	"strings"
	"testing"
)

// TestReproposalStoresBallotOnly: leader 1 gets ten 64 KiB values accepted
// by nodes 2 and 3 but learns of no acceptance (it commits nothing) and
// dies. Node 2 leads and re-proposes the ten values under its ballot: on
// itself and on node 3 each is handed out as a re-ballot (Held: the
// ballot of the copy already stored), and the log room its election
// counted is that of re-ballots; the values commit and apply intact.
// Planted (TestingNoReballot): every re-proposal is stored whole.
func TestReproposalStoresBallotOnly(t *testing.T) {
	rb, room, applied := reproposeAfterLeaderDies(t)
	if rb[2] != 10 || rb[3] != 10 || applied != 10 {
		t.Fatalf("re-ballots stored: node 2 %d, node 3 %d; values applied intact on node 3: %d; want 10, 10, 10", rb[2], rb[3], applied)
	}
	TestingNoReballot = true
	defer func() { TestingNoReballot = false }()
	prb, proom, papplied := reproposeAfterLeaderDies(t)
	if prb[2] != 0 || prb[3] != 0 || papplied != 10 || proom < 10*valueKiB<<10 {
		t.Fatalf("planted: re-ballots %v, log room counted %d, applied %d: want none, at least the values, 10", prb, proom, papplied)
	}
	if room >= 10*valueKiB<<10/8 {
		t.Fatalf("log room counted for the re-proposals: %d bytes, want a fraction of the values' %d", room, 10*valueKiB<<10)
	}
	fmt.Printf("re-ballots: reproposed=10 value_kib=%d stored_as_ballot=[node2:%d node3:%d] room_counted_bytes=%d; planted (no re-ballots): stored_as_ballot=%d room_counted_bytes=%d\n",
		valueKiB, rb[2], rb[3], room, prb[2]+prb[3], proom)
}

const valueKiB = 64

// reproposeAfterLeaderDies runs the scenario and returns the re-ballots
// each node stored, the bytes node 2's log-room check counted for the
// re-proposals, and how many of the ten values node 3 applied intact.
func reproposeAfterLeaderDies(t *testing.T) (rb map[NodeID]int, room int64, applied int) {
	nw := newNetwork(t, 3)
	for nw.leader() != 1 {
		nw.nodes[1].electionElapsed = nw.nodes[1].electionTimeout
		nw.tick(1)
	}
	nw.tick(2)
	nw.dropNext = func(m Message) bool { return m.Type == MsgAccepted && m.To == 1 }
	vals := map[string]bool{}
	for i := range 10 {
		v := fmt.Sprintf("v%02d", i) + strings.Repeat("x", valueKiB<<10-3)
		vals[v] = true
		nw.propose(1, v)
	}
	if c := nw.nodes[1].Status().Commit; c > 1 {
		t.Fatalf("leader 1 committed %d: want nothing past its noop", c)
	}
	nw.crash(1)
	nw.dropNext = nil
	n2 := nw.nodes[2]
	n2.SetLogRoom(1 << 30)
	for range 100 {
		nw.tick(1)
		if l := nw.leader(); l != 0 {
			break
		}
	}
	if l := nw.leader(); l != 2 && l != 3 {
		t.Fatalf("no leader after node 1 died (%d)", l)
	}
	// Whoever leads, the other stores as an acceptor: the counts are per
	// node, and the room is the one node 2's log would need to lead.
	room = n2.reproposalBytes(1 << 40)
	nw.tick(20)
	for _, e := range nw.applied[3] {
		if e.Type == EntryNormal && len(e.Cmds) == 1 && vals[string(e.Cmds[0])] {
			applied++
		}
	}
	return nw.reballots, room, applied
}
