package replica

import (
	"sync"

	"synod/accel"
	"synod/paxos"
)

// Bounds of the runtime's plane-versus-software commit check.
const (
	// checkLagSlotsMax is how far below the node's commit index a slot is
	// judged and forgotten. Neither stream can still report such a slot:
	// software commits only above its commit index, and the aggregator
	// holds a row for at most WindowSlots below its window base (the
	// commit index + 1), so a lag of four windows leaves a wide margin.
	checkLagSlotsMax = 4 * accelWindowSlots
	// checkSlotsMax bounds the slots held at once; beyond it the lowest are
	// judged early (a burst of out-of-window plane events cannot grow the
	// table without bound).
	checkSlotsMax = 8 * accelWindowSlots
	// checkBallotsPerSlotMax bounds the ballots remembered per slot and
	// side (one normally; a re-proposal after a leader change adds one).
	checkBallotsPerSlotMax = 4
	// checkLeaderBallotsMax bounds the ballots whose highest software
	// commit is remembered (the newest ones are kept).
	checkLeaderBallotsMax = 16
)

// accelCheck is accel.Checker with a bounded memory, for a replica that runs
// for months: it compares the plane's commit events with software's
// committed AckEvents slot by slot, and judges a slot (counts it as agreeing,
// excused or mismatching) once it falls checkLagSlotsMax below the commit
// index, then forgets it. The verdict rules are accel.JudgeSlot's, ballot
// by ballot: a ballot only software committed is excused when the plane
// handed up an Arm or Accepted of the slot at that ballot (declining is
// allowed); a ballot only the plane committed is excused unless software,
// leading at it, went on to commit a higher slot (see judgeLocked).
type accelCheck struct {
	mu    sync.Mutex
	slots map[paxos.Slot]*checkSlot
	res   accel.CheckResult // verdicts on forgotten slots, plus HandUps
	// mark: every slot below it was judged and forgotten (a late event
	// for one is held again and judged at eviction or by result).
	mark paxos.Slot
	// commit is the node's commit index as last reported: slots above it
	// are still in flight and result leaves them unjudged.
	commit paxos.Slot
	// softTop is, per recent ballot, the highest slot software committed
	// at it (see judgeLocked).
	softTop []slotBallot
}

type checkSlot struct {
	plane, soft, handedUp []paxos.Ballot
}

func newAccelCheck() *accelCheck {
	return &accelCheck{slots: make(map[paxos.Slot]*checkSlot)}
}

func (c *accelCheck) slot(s paxos.Slot) *checkSlot {
	cs := c.slots[s]
	if cs == nil {
		if len(c.slots) >= checkSlotsMax {
			c.judgeLowestLocked()
		}
		cs = &checkSlot{}
		c.slots[s] = cs
	}
	return cs
}

func addCheckBallot(bs []paxos.Ballot, b paxos.Ballot) []paxos.Ballot {
	for _, x := range bs {
		if x == b {
			return bs
		}
	}
	if len(bs) >= checkBallotsPerSlotMax {
		return bs
	}
	return append(bs, b)
}

// plane records the plane's outputs (OutCommit and OutHandUp matter).
func (c *accelCheck) plane(evs []accel.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range evs {
		switch e.Kind {
		case accel.OutCommit:
			cs := c.slot(e.Slot)
			cs.plane = addCheckBallot(cs.plane, e.Ballot)
		case accel.OutHandUp:
			c.res.HandUps++
			if k := accel.Kind(e.Len); k == accel.InArm || k == accel.InAccepted {
				cs := c.slot(e.Slot)
				cs.handedUp = addCheckBallot(cs.handedUp, e.Ballot)
			}
		}
	}
}

// withheld records that the runtime held Accepteds of (s, b) back from the
// plane for an Arm that never came (accel_own.go): like a hand-up, it
// excuses a software-only commit of (s, b).
func (c *accelCheck) withheld(s paxos.Slot, b paxos.Ballot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s < c.mark {
		return // judged already
	}
	cs := c.slot(s)
	cs.handedUp = addCheckBallot(cs.handedUp, b)
}

// software records the leader's committed AckEvents.
func (c *accelCheck) software(acks []paxos.AckEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range acks {
		if a.Committed {
			cs := c.slot(a.Slot)
			cs.soft = addCheckBallot(cs.soft, a.Ballot)
			c.noteSoftTopLocked(a.Slot, a.Ballot)
		}
	}
}

func (c *accelCheck) noteSoftTopLocked(s paxos.Slot, b paxos.Ballot) {
	for i := range c.softTop {
		if c.softTop[i].ballot == b {
			c.softTop[i].slot = max(c.softTop[i].slot, s)
			return
		}
	}
	if len(c.softTop) == checkLeaderBallotsMax {
		copy(c.softTop, c.softTop[1:])
		c.softTop = c.softTop[:len(c.softTop)-1]
	}
	c.softTop = append(c.softTop, slotBallot{slot: s, ballot: b})
}

// softPassed reports whether software, at ballot b, committed a slot above s.
func (c *accelCheck) softPassed(s paxos.Slot, b paxos.Ballot) bool {
	for _, t := range c.softTop {
		if t.ballot == b {
			return t.slot > s
		}
	}
	return false
}

// forgetBelow judges and forgets every slot below commit-checkLagSlotsMax.
func (c *accelCheck) forgetBelow(commit paxos.Slot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commit = max(c.commit, commit)
	if commit <= checkLagSlotsMax {
		return
	}
	mark := commit - checkLagSlotsMax
	if mark <= c.mark {
		return
	}
	if uint64(mark-c.mark) <= uint64(len(c.slots)) {
		// The usual case: the commit index moved a little; visit the
		// slots that fell below the mark (O(slots committed)).
		for s := c.mark; s < mark; s++ {
			if cs := c.slots[s]; cs != nil {
				c.judgeLocked(s, cs, &c.res)
				delete(c.slots, s)
			}
		}
	} else {
		for s, cs := range c.slots {
			if s < mark {
				c.judgeLocked(s, cs, &c.res)
				delete(c.slots, s)
			}
		}
	}
	c.mark = mark
}

func (c *accelCheck) judgeLowestLocked() {
	first := true
	var low paxos.Slot
	for s := range c.slots {
		if first || s < low {
			low, first = s, false
		}
	}
	if !first {
		c.judgeLocked(low, c.slots[low], &c.res)
		delete(c.slots, low)
	}
}

func (c *accelCheck) judgeLocked(s paxos.Slot, cs *checkSlot, r *accel.CheckResult) {
	r.Commits += len(cs.soft)
	// A ballot only the plane committed: the plane counted a quorum
	// software never counted. That is a disagreement only if software,
	// leading at that ballot, went on to commit a higher slot; otherwise
	// it stepped down or stopped before the Accepted reached it (the slot
	// is committed by the next leader), which is timing, not a different
	// decision.
	excused, why := accel.JudgeSlot(s, accel.SlotCommits{Plane: cs.plane, Soft: cs.soft, HandedUp: cs.handedUp},
		func(b paxos.Ballot) bool { return !c.softPassed(s, b) })
	r.Excused += excused
	if why == "" {
		return
	}
	r.Mismatches++
	if r.First == "" {
		r.First = why
	}
}

// result judges the held slots at or below the commit index (without
// forgetting them) on top of the verdicts already given; slots above it
// are in flight.
func (c *accelCheck) result() accel.CheckResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.res
	for s, cs := range c.slots {
		if s <= c.commit {
			c.judgeLocked(s, cs, &r)
		}
	}
	return r
}

// held is the number of slots held (tests).
func (c *accelCheck) held() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.slots)
}
