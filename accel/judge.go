package accel

import (
	"fmt"
	"slices"

	"synod/paxos"
)

// SlotCommits is what a checker recorded for one slot: the ballots the
// plane committed it at, the ballots software committed it at, and the
// ballots at which the plane handed up an Arm or an Accepted for it.
type SlotCommits struct {
	Plane, Soft, HandedUp []paxos.Ballot
}

// JudgeSlot judges one slot ballot by ballot, the rule every checker of
// the plane against software uses:
//
//   - a ballot both committed agrees;
//   - a ballot only software committed is excused when the plane handed up
//     an Arm or Accepted of that slot at that ballot (declining is allowed:
//     the plane never saw the quorum), and mismatches otherwise;
//   - a ballot only the plane committed is excused when planeOnlyExcused
//     says so (nil: never; the runtime excuses a leader that stepped down
//     before the acks reached software) and mismatches otherwise.
//
// Judging ballot by ballot matters when one leader commits a slot twice,
// at two of its ballots (it lost and regained leadership before the slot
// reached its commit index, then re-proposed it): the plane may have
// declined the first and counted the second, and comparing the two sets
// as wholes would call that a disagreement although each ballot obeys the
// rules. It returns the number of excused ballots and, for a mismatch, a
// description.
func JudgeSlot(s paxos.Slot, c SlotCommits, planeOnlyExcused func(paxos.Ballot) bool) (excused int, mismatch string) {
	for _, b := range c.Soft {
		switch {
		case slices.Contains(c.Plane, b):
		case slices.Contains(c.HandedUp, b):
			excused++
		default:
			return excused, fmt.Sprintf("slot %d: plane committed %v, software %v (handed up at %v): software's %v not in the plane's", s, c.Plane, c.Soft, c.HandedUp, b)
		}
	}
	for _, b := range c.Plane {
		switch {
		case slices.Contains(c.Soft, b):
		case planeOnlyExcused != nil && planeOnlyExcused(b):
			excused++
		default:
			return excused, fmt.Sprintf("slot %d: plane committed %v, software %v: the plane's %v not in software's", s, c.Plane, c.Soft, b)
		}
	}
	return excused, ""
}
