package accel_test

import (
	"fmt"
	"slices"
	"sort"

	"synod/accel"
	"synod/paxos"
)

// simCheck is the runtime's plane-versus-software commit check
// (kv/replica/accel_check.go) without its memory bound (a simulator run is
// short), plus the simulator's prompt rule (prompt): per slot, the ballots
// the plane and software committed and whether the plane handed up an Arm
// or Accepted for it; per ballot, the highest slot software committed at
// it.
type simCheck struct {
	slots   map[paxos.Slot]*simCheckSlot
	handUps uint64
	softTop map[paxos.Ballot]paxos.Slot
	// early holds, per slot, the first plane commit the prompt rule found
	// software had not made (simCheck.prompt), described.
	early map[paxos.Slot]string
}

type simCheckSlot struct {
	plane, soft, handedUp []paxos.Ballot
}

func newSimCheck() *simCheck {
	return &simCheck{slots: map[paxos.Slot]*simCheckSlot{}, softTop: map[paxos.Ballot]paxos.Slot{}, early: map[paxos.Slot]string{}}
}

func (c *simCheck) slot(s paxos.Slot) *simCheckSlot {
	cs := c.slots[s]
	if cs == nil {
		cs = &simCheckSlot{}
		c.slots[s] = cs
	}
	return cs
}

func addSimBallot(bs []paxos.Ballot, b paxos.Ballot) []paxos.Ballot {
	if slices.Contains(bs, b) {
		return bs
	}
	return append(bs, b)
}

func (c *simCheck) plane(evs []accel.Event) {
	for _, e := range evs {
		switch e.Kind {
		case accel.OutCommit:
			cs := c.slot(e.Slot)
			cs.plane = addSimBallot(cs.plane, e.Ballot)
		case accel.OutHandUp:
			c.handUps++
			if k := accel.Kind(e.Len); k == accel.InArm || k == accel.InAccepted {
				cs := c.slot(e.Slot)
				cs.handedUp = addSimBallot(cs.handedUp, e.Ballot)
			}
		}
	}
}

// withheld records that the runtime kept Accepteds of (s, b) from the
// plane and never armed it (the leader's own acceptance never became
// durable while it led): like a hand-up, it excuses a software-only commit
// (kv/replica's accelCheck.withheld).
func (c *simCheck) withheld(s paxos.Slot, b paxos.Ballot) {
	cs := c.slot(s)
	cs.handedUp = addSimBallot(cs.handedUp, b)
}

func (c *simCheck) software(acks []paxos.AckEvent) {
	for _, a := range acks {
		if a.Committed {
			cs := c.slot(a.Slot)
			cs.soft = addSimBallot(cs.soft, a.Ballot)
			c.softTop[a.Ballot] = max(c.softTop[a.Ballot], a.Slot)
		}
	}
}

// prompt applies the simulator's prompt rule to a plane commit of (s, b):
// the caller has handed software the input whose plane inputs made the
// commit, drained its Ready rounds, and found it still leading at b, so
// software has counted every ack the plane counted; if it has not
// committed (s, b) the plane committed on acks software did not count as
// a quorum (early, or on an ack software ignores): a mismatch that no
// later software commit excuses.
func (c *simCheck) prompt(s paxos.Slot, b paxos.Ballot) {
	if cs := c.slots[s]; (cs != nil && slices.Contains(cs.soft, b)) || c.early[s] != "" {
		return
	}
	c.slot(s) // judged with the others, even if nothing else names s
	c.early[s] = fmt.Sprintf("slot %d: plane committed at %v before software did (software still leading at %v after the same input)", s, b, b)
}

// result judges every slot. value is asked about every plane commit and
// returns a description when the committed (slot, ballot) names a value
// other than the chosen one: that is a mismatch whatever the other rules
// say, and so is a commit the prompt rule found early. endBallot is the
// ballot the incarnation led with when it ended (zero if it was not
// leading then); crashed says it ended by a crash.
//
// A plane-only commit at ballot b is judged as follows. Software still
// leading at b when the run ended had every ack the plane had and never
// committed: mismatch. Software that crashed while leading at b may have
// decided in the Ready the crash lost (the simulator crashes nodes between
// a Ready's durable part and its messages): excused. Otherwise the
// runtime's rule: a mismatch only if software committed a higher slot at
// b (it went on without this one), else it stepped down before the acks
// reached it: excused.
func (c *simCheck) result(value func(paxos.Slot, paxos.Ballot) string, endBallot paxos.Ballot, crashed bool) accel.CheckResult {
	var r accel.CheckResult
	r.HandUps = c.handUps
	slots := make([]paxos.Slot, 0, len(c.slots))
	for s := range c.slots {
		slots = append(slots, s)
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i] < slots[j] })
	mismatch := func(why string) {
		r.Mismatches++
		if r.First == "" {
			r.First = why
		}
	}
	for _, s := range slots {
		cs := c.slots[s]
		r.Commits += len(cs.soft)
		wrong := ""
		for _, b := range cs.plane {
			if w := value(s, b); w != "" && wrong == "" {
				wrong = w
			}
		}
		if wrong != "" {
			mismatch(wrong)
			continue
		}
		if early := c.early[s]; early != "" {
			mismatch(early)
			continue
		}
		excused, why := accel.JudgeSlot(s, accel.SlotCommits{Plane: cs.plane, Soft: cs.soft, HandedUp: cs.handedUp},
			func(b paxos.Ballot) bool {
				switch {
				case !crashed && b == endBallot:
					return false // software still leading at b never committed it
				case crashed && !endBallot.IsZero():
					return true // crashed leading: software's decision may be in the lost Ready
				}
				// Software, leading at b, never committed past the slot: it
				// stepped down before the acks reached it (timing).
				return !c.softPassedAny(s, []paxos.Ballot{b})
			})
		r.Excused += excused
		if why != "" {
			mismatch(why)
		}
	}
	return r
}

func (c *simCheck) softPassedAny(s paxos.Slot, bs []paxos.Ballot) bool {
	for _, b := range bs {
		if top, ok := c.softTop[b]; ok && top > s {
			return true
		}
	}
	return false
}
