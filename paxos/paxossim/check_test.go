package paxossim

import (
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"

	"synod/paxos"
)

func putCmd(client uint32, seq uint64, key, val string) []byte {
	return appendCommand(nil, &command{Op: opPut, Client: client, Seq: seq, Key: key, Value: val})
}

// TestCheckerCatchesTwoValuesInOneSlot plants the bug the whole simulator
// exists to find: two replicas commit different values in one slot.
func TestCheckerCatchesTwoValuesInOneSlot(t *testing.T) {
	c := newChecker(2)
	e1 := paxos.Entry{Slot: 4, Ballot: paxos.Ballot{Round: 1, Node: 1}, Type: paxos.EntryNormal, Cmds: [][]byte{putCmd(1, 1, "x", "a")}}
	e2 := paxos.Entry{Slot: 4, Ballot: paxos.Ballot{Round: 2, Node: 2}, Type: paxos.EntryNormal, Cmds: [][]byte{putCmd(2, 1, "x", "b")}}
	c.applied(1, &e1, 100)
	if c.count != 0 {
		t.Fatalf("first commit flagged: %v", c.violations)
	}
	// The same value under a later ballot is fine.
	e1b := e1
	e1b.Ballot = paxos.Ballot{Round: 3, Node: 3}
	c.applied(3, &e1b, 100)
	if c.count != 0 {
		t.Fatalf("same value, later ballot flagged: %v", c.violations)
	}
	c.applied(2, &e2, 200)
	if c.count != 2 { // different value, and different state
		t.Fatalf("violations = %d (%v), want 2", c.count, c.violations)
	}
}

func TestCheckerCatchesTwoChosenValues(t *testing.T) {
	c := newChecker(2)
	b1 := paxos.Ballot{Round: 1, Node: 1}
	b2 := paxos.Ballot{Round: 2, Node: 2}
	e1 := paxos.Entry{Slot: 1, Ballot: b1, Type: paxos.EntryNormal, Cmds: [][]byte{putCmd(1, 1, "x", "a")}}
	e2 := paxos.Entry{Slot: 1, Ballot: b2, Type: paxos.EntryNoop}
	c.accepted(1, &e1)
	c.accepted(1, &e1) // repeats do not count twice
	c.accepted(2, &e1) // chosen
	c.accepted(2, &e2)
	if c.count != 0 {
		t.Fatalf("flagged before a second quorum: %v", c.violations)
	}
	c.accepted(3, &e2) // a second quorum chooses another value
	if c.count != 1 || !strings.Contains(c.violations[0], "two values chosen") {
		t.Fatalf("violations = %v, want two values chosen", c.violations)
	}
	// Two values under one ballot are caught even without a quorum.
	e3 := e2
	e3.Type = paxos.EntryNormal
	e3.Cmds = [][]byte{putCmd(9, 9, "y", "z")}
	c.accepted(1, &e3)
	if c.count != 2 {
		t.Fatalf("two values under one ballot not caught: %v", c.violations)
	}
}

func TestCheckerCatchesDoubleCommittedAck(t *testing.T) {
	c := newChecker(2)
	b := paxos.Ballot{Round: 1, Node: 1}
	c.accepted(1, &paxos.Entry{Slot: 1, Ballot: b, Type: paxos.EntryNoop}) // the leader's own vote is durable
	c.ack(1, &paxos.AckEvent{Slot: 1, Ballot: b, From: 1, Count: 1})
	c.ack(1, &paxos.AckEvent{Slot: 1, Ballot: b, From: 2, Count: 2, Committed: true})
	if c.count != 0 {
		t.Fatalf("flagged a valid ack stream: %v", c.violations)
	}
	c.ack(1, &paxos.AckEvent{Slot: 1, Ballot: b, From: 3, Count: 3, Committed: true})
	if c.count != 1 {
		t.Fatalf("second Committed event not caught: %v", c.violations)
	}
	c.ack(2, &paxos.AckEvent{Slot: 2, Ballot: b, From: 2, Count: 1})
	if c.count != 2 {
		t.Fatalf("ack for a foreign ballot not caught: %v", c.violations)
	}
}

func op(client int, in kvInput, call int64, out kvOutput, ret int64) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
}

func known(v string) kvOutput { return kvOutput{Known: true, Value: v} }

// TestLinearizabilityCatchesStaleRead feeds porcupine a history with a read
// that returns a value overwritten before the read began.
func TestLinearizabilityCatchesStaleRead(t *testing.T) {
	good := []porcupine.Operation{
		op(0, kvInput{Op: opPut, Key: "x", Value: "1"}, 0, known(resultOK), 10),
		op(1, kvInput{Op: opPut, Key: "x", Value: "2"}, 11, known(resultOK), 20),
		op(2, kvInput{Op: opGet, Key: "x"}, 12, known("1"), 25), // concurrent with the second put
		op(0, kvInput{Op: opAppend, Key: "y", Value: "a"}, 30, known(resultOK), 40),
		op(1, kvInput{Op: opCAS, Key: "y", Expect: "a", Value: "b"}, 41, known(resultTrue), 50),
		op(2, kvInput{Op: opGet, Key: "y"}, 51, known("b"), 60),
	}
	if why := checkLinearizable(good); why != "" {
		t.Fatalf("linearizable history rejected: %s", why)
	}
	bad := append([]porcupine.Operation(nil), good...)
	bad = append(bad, op(2, kvInput{Op: opGet, Key: "x"}, 30, known("1"), 35)) // stale: "2" was written by 20
	if why := checkLinearizable(bad); why == "" {
		t.Fatal("stale read accepted")
	}
	badCAS := append([]porcupine.Operation(nil), good...)
	badCAS = append(badCAS, op(0, kvInput{Op: opCAS, Key: "y", Expect: "a", Value: "c"}, 61, known(resultTrue), 70))
	if why := checkLinearizable(badCAS); why == "" {
		t.Fatal("a CAS that succeeded against a stale value was accepted")
	}
}

// TestLinearizabilityUnknownOutcome: an operation that never returned may
// or may not have taken effect.
func TestLinearizabilityUnknownOutcome(t *testing.T) {
	for _, seen := range []string{"", "new"} {
		h := []porcupine.Operation{
			op(0, kvInput{Op: opCAS, Key: "x", Expect: "", Value: "new"}, 0, kvOutput{}, returnNever),
			op(1, kvInput{Op: opGet, Key: "x"}, 10, known(seen), 20),
		}
		if why := checkLinearizable(h); why != "" {
			t.Fatalf("read of %q after an unfinished CAS rejected: %s", seen, why)
		}
	}
	h := []porcupine.Operation{
		op(0, kvInput{Op: opPut, Key: "x", Value: "v"}, 0, kvOutput{}, returnNever),
		op(1, kvInput{Op: opGet, Key: "x"}, 10, known("w"), 20),
	}
	if why := checkLinearizable(h); why == "" {
		t.Fatal("a read of a value nobody wrote was accepted")
	}
}

// The leader's own vote must be in its durable store before it counts; a
// follower's ack is not checked (it may ack a slot it holds committed at
// another ballot). Each early vote counts, the first few are described.
func TestCheckerCatchesEarlyOwnVote(t *testing.T) {
	c := newChecker(2)
	b := paxos.Ballot{Round: 1, Node: 1}
	c.ack(1, &paxos.AckEvent{Slot: 1, Ballot: b, From: 2, Count: 1})
	if c.count != 0 {
		t.Fatalf("a follower's ack was flagged: %v", c.violations)
	}
	for s := paxos.Slot(1); s <= earlyVoteReportsMax+2; s++ {
		c.ack(1, &paxos.AckEvent{Slot: s, Ballot: b, From: 1, Count: 2})
	}
	if c.count != earlyVoteReportsMax+2 || len(c.violations) != earlyVoteReportsMax ||
		!strings.Contains(c.violations[0], "before it was durable") {
		t.Fatalf("early own votes: count %d, violations %v", c.count, c.violations)
	}
	c.accepted(1, &paxos.Entry{Slot: 9, Ballot: b, Type: paxos.EntryNoop})
	c.ack(1, &paxos.AckEvent{Slot: 9, Ballot: b, From: 1, Count: 1})
	if c.count != earlyVoteReportsMax+2 {
		t.Fatalf("a durable own vote was flagged: %v", c.violations)
	}
}
