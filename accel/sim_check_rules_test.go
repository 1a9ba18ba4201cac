package accel_test

import (
	"testing"

	"synod/accel"
	"synod/paxos"
)

// TestSimCheckRules plants each kind of disagreement in simCheck directly
// and requires the verdict the harness documents.
func TestSimCheckRules(t *testing.T) {
	b1, b2 := paxos.Ballot{Round: 1, Node: 1}, paxos.Ballot{Round: 2, Node: 1}
	commit := func(s paxos.Slot, b paxos.Ballot) accel.Event {
		return accel.Event{Kind: accel.OutCommit, Slot: s, Ballot: b}
	}
	soft := func(s paxos.Slot, b paxos.Ballot) paxos.AckEvent {
		return paxos.AckEvent{Slot: s, Ballot: b, Committed: true}
	}
	handUp := func(s paxos.Slot, b paxos.Ballot) accel.Event {
		return accel.Event{Kind: accel.OutHandUp, Len: uint32(accel.InAccepted), Slot: s, Ballot: b}
	}
	noValue := func(paxos.Slot, paxos.Ballot) string { return "" }
	cases := []struct {
		name     string
		plane    []accel.Event
		soft     []paxos.AckEvent
		value    func(paxos.Slot, paxos.Ballot) string
		end      paxos.Ballot
		crashed  bool
		mismatch int
		excused  int
	}{
		{"agree", []accel.Event{commit(1, b1)}, []paxos.AckEvent{soft(1, b1)}, noValue, b1, false, 0, 0},
		{"software only", nil, []paxos.AckEvent{soft(1, b1)}, noValue, b1, false, 1, 0},
		{"software only, handed up", []accel.Event{handUp(1, b1)}, []paxos.AckEvent{soft(1, b1)}, noValue, b1, false, 0, 1},
		{"software only, handed up at another ballot", []accel.Event{handUp(1, b2)}, []paxos.AckEvent{soft(1, b1)}, noValue, b1, false, 1, 0},
		// One leader committed slot 1 at two of its ballots (it lost and
		// regained leadership before the slot reached its commit index);
		// the plane declined the first and counted the second (accel sim
		// seed 8 after the retransmission backoff, seeds 3988 and 4219
		// before): each ballot obeys the rules.
		{"re-proposed at a second ballot, first handed up", []accel.Event{handUp(1, b1), commit(1, b2)},
			[]paxos.AckEvent{soft(1, b1), soft(1, b2)}, noValue, b2, false, 0, 1},
		{"re-proposed at a second ballot, first not handed up", []accel.Event{commit(1, b2)},
			[]paxos.AckEvent{soft(1, b1), soft(1, b2)}, noValue, b2, false, 1, 0},
		{"different ballots", []accel.Event{commit(1, b1)}, []paxos.AckEvent{soft(1, b2)}, noValue, b2, false, 1, 0},
		{"plane only, still leading", []accel.Event{commit(1, b1)}, nil, noValue, b1, false, 1, 0},
		{"plane only, crashed leading", []accel.Event{commit(1, b1)}, nil, noValue, b1, true, 0, 1},
		{"plane only, stepped down", []accel.Event{commit(1, b1)}, nil, noValue, paxos.Ballot{}, false, 0, 1},
		{"plane only, software went on", []accel.Event{commit(1, b1), commit(2, b1)}, []paxos.AckEvent{soft(2, b1)}, noValue, paxos.Ballot{}, false, 1, 0},
		{"wrong value", []accel.Event{commit(1, b1)}, []paxos.AckEvent{soft(1, b1)},
			func(paxos.Slot, paxos.Ballot) string { return "not chosen" }, b1, false, 1, 0},
	}
	for _, c := range cases {
		chk := newSimCheck()
		chk.plane(c.plane)
		chk.software(c.soft)
		r := chk.result(c.value, c.end, c.crashed)
		if r.Mismatches != c.mismatch || r.Excused != c.excused {
			t.Errorf("%s: mismatches=%d excused=%d, want %d and %d (%s)", c.name, r.Mismatches, r.Excused, c.mismatch, c.excused, r.First)
		}
	}

	// The prompt rule: a plane commit that software, still leading at its
	// ballot after the same input, has not made is a mismatch, even when
	// software commits the same (slot, ballot) later (an early commit).
	prompts := []struct {
		name                  string
		softBefore, softAfter bool
		mismatch              int
	}{
		{"prompt, software committed first", true, false, 0},
		{"prompt, software never committed", false, false, 1},
		{"prompt, software committed later", false, true, 1},
	}
	for _, c := range prompts {
		chk := newSimCheck()
		chk.plane([]accel.Event{commit(1, b1)})
		if c.softBefore {
			chk.software([]paxos.AckEvent{soft(1, b1)})
		}
		chk.prompt(1, b1)
		if c.softAfter {
			chk.software([]paxos.AckEvent{soft(1, b1)})
		}
		if r := chk.result(noValue, b1, false); r.Mismatches != c.mismatch {
			t.Errorf("%s: mismatches=%d, want %d (%s)", c.name, r.Mismatches, c.mismatch, r.First)
		}
	}
}
