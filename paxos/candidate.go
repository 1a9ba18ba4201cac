package paxos

import (
	"bytes"
	"slices"
)

// candidate is the phase 1 state of a node campaigning under ballot.
type candidate struct {
	ballot  Ballot
	from    Slot             // phase 1 covers every slot >= from
	through map[NodeID]Slot  // slots reported so far per acceptor (chunked promises)
	done    map[NodeID]bool  // acceptors whose promise is complete
	sent    map[NodeID]bool  // acceptors sent a Prepare
	values  map[Slot]adopted // value to re-propose per slot
	maxSlot Slot             // highest slot any promise reported
}

// adopted is the value phase 1 picked for a slot so far.
type adopted struct {
	e      Entry
	chosen bool // reported as committed by some acceptor
}

// add folds one reported entry into the adopted values: a committed
// (chosen) value wins outright, otherwise the highest ballot wins.
func (c *candidate) add(n *Node, e *Entry, chosen bool) {
	if e.Slot < c.from {
		return
	}
	cur, ok := c.values[e.Slot]
	switch {
	case !ok:
	case cur.chosen && chosen:
		if !sameValue(&cur.e, e) {
			n.invariantf("two different chosen values reported for slot %d: %v and %v", e.Slot, cur.e, *e)
		}
		return
	case cur.chosen:
		return
	case !chosen && !cur.e.Ballot.Less(e.Ballot):
		return
	}
	c.values[e.Slot] = adopted{e: *e, chosen: chosen}
	c.maxSlot = max(c.maxSlot, e.Slot)
}

// sameValue reports whether a and b hold the same value: type and
// commands (the ballot aside).
func sameValue(a, b *Entry) bool {
	if a.Type != b.Type || len(a.Cmds) != len(b.Cmds) {
		return false
	}
	for i := range a.Cmds {
		if !bytes.Equal(a.Cmds[i], b.Cmds[i]) {
			return false
		}
	}
	return true
}

func (n *Node) handlePromise(m *Message) {
	if n.role != RoleCandidate {
		return
	}
	c := n.cand
	if m.Reject {
		if c.ballot.Less(m.Ballot) {
			n.becomeFollower()
		}
		return
	}
	if m.Ballot != c.ballot || c.done[m.From] {
		return
	}
	want, ok := c.through[m.From]
	if !ok {
		want = c.from - 1
	}
	if m.Slot != want+1 {
		return // a duplicate or stale chunk
	}
	for i := range m.Entries {
		e := &m.Entries[i]
		c.add(n, e, e.Slot <= m.Commit)
	}
	if m.Index < m.Last {
		c.through[m.From] = m.Index
		n.send(Message{Type: MsgPrepare, To: m.From, Ballot: c.ballot, Slot: m.Index + 1, Commit: n.commit})
		return
	}
	c.done[m.From] = true
	n.checkPhase1()
}

// checkPhase1 becomes leader once, for every membership that governs a slot
// the leader will propose in, a majority has promised (see
// ProposeConfChange). It sends Prepares to members not asked yet.
func (n *Node) checkPhase1() {
	c := n.cand
	voters, learners := n.conf.at(c.from), n.conf.learnersAt(c.from)
	chain := [][]NodeID{voters}
	var ccSlots []Slot
	for s, v := range c.values {
		if v.e.Type == EntryConfChange {
			ccSlots = append(ccSlots, s)
		}
	}
	slices.Sort(ccSlots)
	if TestingPhase1IgnoresAdoptedConfChange {
		ccSlots = nil // planted: only the membership at the commit point counts
	}
	for _, s := range ccSlots {
		v := c.values[s]
		if cc, ok := entryConfChange(&v.e); ok {
			if nv, nl, err := applyConfChange(voters, learners, cc); err == nil {
				voters, learners = nv, nl
				chain = append(chain, nv)
			}
		}
	}
	ready := true
	for _, members := range chain {
		got := 0
		for _, id := range members {
			if c.done[id] {
				got++
			}
			if !c.sent[id] {
				c.sent[id] = true
				n.known[id] = true
				n.send(Message{Type: MsgPrepare, To: id, Ballot: c.ballot, Slot: c.from, Commit: n.commit})
			}
		}
		if got < quorum(len(members)) {
			ready = false
		}
	}
	if ready {
		if !n.roomForPhase2() {
			// The values the promises brought would not fit in the log
			// room: stay a follower, so that a member with room leads
			// (logroom.go).
			n.becomeFollower()
			return
		}
		n.becomeLeader()
	}
}
