package paxossim

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"

	"synod/paxos"
)

// violationsMax bounds how many violation messages one run keeps (the count
// keeps going).
const violationsMax = 20

// earlyVoteReportsMax is how many early own votes one run describes.
const earlyVoteReportsMax = 3

// slotBallot keys per-(slot, ballot) records.
type slotBallot struct {
	slot   paxos.Slot
	ballot paxos.Ballot
}

// ackRecord is what the checker knows about the leader's AckEvents for one
// (slot, ballot).
type ackRecord struct {
	count     int
	committed bool
}

// acceptRecord tracks acceptances of one (slot, ballot) across acceptors.
type acceptRecord struct {
	value uint64
	nodes []paxos.NodeID
}

// checker holds the cross-node safety state of one run. Every method is a
// check that records a violation instead of stopping the run, so one run
// reports everything it sees.
type checker struct {
	violations []string
	count      int
	// safety counts the end-to-end safety violations among count: two
	// values chosen or committed in a slot, diverged replica state, a
	// non-linearizable history. The protocol-level checks (AckEvents,
	// promises) catch many bugs earlier; planted-bug tests use this count
	// to show the end-to-end checks catch them too.
	safety int

	// committed value of each slot, the first time any node applied it.
	slotValue map[paxos.Slot]uint64
	// application state after applying each slot.
	slotState map[paxos.Slot]uint64
	// chosen value per slot, computed from acceptor durable records alone
	// (a majority of the fixed membership accepting the same (slot,
	// ballot)); only meaningful while membership never changed.
	accepts      map[slotBallot]*acceptRecord
	chosen       map[paxos.Slot]uint64
	quorum       int // 0 disables the acceptor-side chosen check
	acks         map[slotBallot]*ackRecord
	valuesByHash map[uint64]string // for readable reports
	// earlyVotes counts own votes a leader counted before they were
	// durable (all violations; the first earlyVoteReportsMax described).
	earlyVotes int
	// quorums is the voter-quorum oracle (check_quorum.go); use q().
	quorums *quorumOracle
}

func newChecker(quorum int) *checker {
	return &checker{
		slotValue:    map[paxos.Slot]uint64{},
		slotState:    map[paxos.Slot]uint64{},
		accepts:      map[slotBallot]*acceptRecord{},
		chosen:       map[paxos.Slot]uint64{},
		quorum:       quorum,
		acks:         map[slotBallot]*ackRecord{},
		valuesByHash: map[uint64]string{},
	}
}

func (c *checker) violateSafety(format string, args ...any) {
	c.safety++
	c.violate(format, args...)
}

func (c *checker) violate(format string, args ...any) {
	c.count++
	if len(c.violations) < violationsMax {
		c.violations = append(c.violations, fmt.Sprintf(format, args...))
	}
}

// entryValue fingerprints the value of an entry: its type and commands,
// not the ballot (the same value may be chosen again under a later ballot).
func entryValue(e *paxos.Entry) uint64 {
	h := fnv.New64a()
	h.Write([]byte{byte(e.Type)})
	var n [4]byte
	for _, b := range e.Cmds {
		binary.BigEndian.PutUint32(n[:], uint32(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	return h.Sum64()
}

func describeEntry(e *paxos.Entry) string {
	s := fmt.Sprintf("type=%d ballot=%d.%d", e.Type, e.Ballot.Round, e.Ballot.Node)
	for _, b := range e.Cmds {
		if c, err := decodeCommand(b); err == nil {
			s += fmt.Sprintf(" [%s c%d#%d %s=%q]", c.Op, c.Client, c.Seq, c.Key, c.Value)
		} else {
			s += fmt.Sprintf(" [%d bytes]", len(b))
		}
	}
	return s
}

// accepted records that node made e durable as accepted. Two different
// values accepted under the same (slot, ballot) break Paxos (a ballot
// proposes one value per slot); a value accepted by a quorum is chosen, and
// a slot may only ever have one chosen value.
func (c *checker) accepted(node paxos.NodeID, e *paxos.Entry) {
	v := entryValue(e)
	k := slotBallot{e.Slot, e.Ballot}
	r := c.accepts[k]
	if r == nil {
		r = &acceptRecord{value: v}
		c.accepts[k] = r
		c.q().newBallot(e.Slot, e.Ballot)
	}
	if r.value != v {
		c.violateSafety("slot %d ballot %v: node %d accepted a different value than another acceptor under the same ballot: %s",
			e.Slot, e.Ballot, node, describeEntry(e))
		return
	}
	for _, n := range r.nodes {
		if n == node {
			return
		}
	}
	r.nodes = append(r.nodes, node)
	if c.quorum == 0 || len(r.nodes) < c.quorum {
		return
	}
	if old, ok := c.chosen[e.Slot]; ok && old != v {
		c.violateSafety("slot %d: two values chosen by acceptor quorums (second under ballot %v: %s)", e.Slot, e.Ballot, describeEntry(e))
		return
	}
	c.chosen[e.Slot] = v
}

// applied records that node applied the committed entry e, leaving its
// application in a state with fingerprint state.
func (c *checker) applied(node paxos.NodeID, e *paxos.Entry, state uint64) {
	v := entryValue(e)
	if old, ok := c.slotValue[e.Slot]; ok && old != v {
		c.violateSafety("slot %d: node %d committed %s, another node committed %s",
			e.Slot, node, describeEntry(e), c.valuesByHash[old])
	} else if !ok {
		c.slotValue[e.Slot] = v
		c.valuesByHash[v] = describeEntry(e)
	}
	if ch, ok := c.chosen[e.Slot]; ok && ch != v {
		c.violateSafety("slot %d: node %d committed %s, but acceptors chose a different value", e.Slot, node, describeEntry(e))
	}
	c.q().applied(c, node, e)
	c.state(node, e.Slot, state)
}

// state checks that node's application state at slot equals every other
// node's state at that slot.
func (c *checker) state(node paxos.NodeID, slot paxos.Slot, state uint64) {
	if old, ok := c.slotState[slot]; ok && old != state {
		c.violateSafety("slot %d: node %d's application state diverged from another replica's", slot, node)
	} else if !ok {
		c.slotState[slot] = state
	}
}

// ack checks one leader AckEvent: counts only grow for a (slot, ballot),
// at most one event per (slot, ballot) says Committed, and the leader
// counts its own acceptance only once it is durable (the durable store
// recorded it: accepted). A follower's is durable before its Accepted
// leaves (the synchronous part of the Ready contract); it may also ack a
// slot it has committed without holding it at that ballot, which is
// harmless, so only the leader's own vote is checked.
func (c *checker) ack(node paxos.NodeID, ev *paxos.AckEvent) {
	k := slotBallot{ev.Slot, ev.Ballot}
	r := c.acks[k]
	if r == nil {
		r = &ackRecord{}
		c.acks[k] = r
	}
	if ev.From == node && ev.Ballot.Node == node {
		if a := c.accepts[k]; a == nil || !slices.Contains(a.nodes, node) {
			// One such bug repeats on every slot: keep room in the
			// report for what follows from it.
			if c.earlyVotes++; c.earlyVotes <= earlyVoteReportsMax {
				c.violate("slot %d ballot %v: leader %d counted its own acceptance before it was durable", ev.Slot, ev.Ballot, node)
			} else {
				c.count++
			}
		}
	}
	if ev.Ballot.Node != node {
		c.violate("node %d reported an AckEvent for another node's ballot %v (slot %d)", node, ev.Ballot, ev.Slot)
	}
	if ev.Count < 1 {
		c.violate("slot %d ballot %v: AckEvent count %d < 1", ev.Slot, ev.Ballot, ev.Count)
	}
	if ev.Count > r.count {
		r.count = ev.Count
	}
	if ev.Committed {
		c.q().committed(c, node, ev)
		if c.quorum > 0 && ev.Count < c.quorum {
			c.violate("slot %d ballot %v: Committed AckEvent with %d acks, quorum is %d", ev.Slot, ev.Ballot, ev.Count, c.quorum)
		}
		if r.committed {
			c.violate("slot %d ballot %v: a second Committed AckEvent", ev.Slot, ev.Ballot)
		}
		r.committed = true
	}
}
