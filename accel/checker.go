package accel

import (
	"fmt"
	"sort"
	"sync"

	"synod/paxos"
)

// Checker compares the plane's commit decisions with software's, which
// are authoritative. Feed it the plane's outputs (Plane) and the paxos
// Ready.AckEvents (Software), in any interleaving, then read Result.
//
// Each slot is judged ballot by ballot (JudgeSlot): a ballot only
// software committed is excused when the plane handed up an Arm or
// Accepted of that slot at that ballot (declining is allowed); a plane
// commit that software never made is never excused here.
type Checker struct {
	mu       sync.Mutex
	plane    map[paxos.Slot][]paxos.Ballot
	soft     map[paxos.Slot][]paxos.Ballot
	handedUp map[paxos.Slot][]paxos.Ballot
	handUps  uint64
}

// CheckResult summarizes a Checker.
type CheckResult struct {
	Commits    int    // (slot, ballot) commits software made
	Mismatches int    // slots where the two disagree
	HandUps    uint64 // OutHandUp events seen
	Excused    int    // (slot, ballot) commits one side made that the rules excuse
	First      string // the first mismatching slot, described
}

func (r CheckResult) String() string {
	return fmt.Sprintf("accel: commits=%d mismatches=%d handups=%d", r.Commits, r.Mismatches, r.HandUps)
}

// NewChecker returns an empty checker.
func NewChecker() *Checker {
	return &Checker{plane: map[paxos.Slot][]paxos.Ballot{}, soft: map[paxos.Slot][]paxos.Ballot{}, handedUp: map[paxos.Slot][]paxos.Ballot{}}
}

func addBallot(m map[paxos.Slot][]paxos.Ballot, s paxos.Slot, b paxos.Ballot) {
	for _, x := range m[s] {
		if x == b {
			return
		}
	}
	m[s] = append(m[s], b)
}

// Plane records the plane's outputs (only OutCommit and OutHandUp matter).
func (c *Checker) Plane(evs []Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range evs {
		switch e.Kind {
		case OutCommit:
			addBallot(c.plane, e.Slot, e.Ballot)
		case OutHandUp:
			c.handUps++
			if k := Kind(e.Len); k == InArm || k == InAccepted {
				addBallot(c.handedUp, e.Slot, e.Ballot)
			}
		}
	}
}

// Software records the leader's AckEvents; those with Committed count.
func (c *Checker) Software(acks []paxos.AckEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range acks {
		if a.Committed {
			addBallot(c.soft, a.Slot, a.Ballot)
		}
	}
}

// Result compares what was recorded so far.
func (c *Checker) Result() CheckResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	var r CheckResult
	r.HandUps = c.handUps
	slots := make([]paxos.Slot, 0, len(c.soft)+len(c.plane))
	for s, bs := range c.soft {
		r.Commits += len(bs)
		slots = append(slots, s)
	}
	for s := range c.plane {
		if _, ok := c.soft[s]; !ok {
			slots = append(slots, s)
		}
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i] < slots[j] })
	for _, s := range slots {
		excused, why := JudgeSlot(s, SlotCommits{Plane: c.plane[s], Soft: c.soft[s], HandedUp: c.handedUp[s]}, nil)
		r.Excused += excused
		if why != "" {
			r.Mismatches++
			if r.First == "" {
				r.First = why
			}
		}
	}
	return r
}
