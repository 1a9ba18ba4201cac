package paxos

// A candidate's promises report some values as committed: those at or below
// the promiser's commit index. Such a value is chosen, whatever the
// membership, and phase 1 already adopts it outright (candidate.add). The
// new leader commits the run of those slots from its commit index on
// without phase 2. Re-proposing them stored every value again under the
// new ballot, on the leader and on each acceptor: a leader killed with
// dozens of committed megabyte entries its followers had accepted left a
// survivor with a full acceptor log that could not re-propose them, stalled
// and lost the leadership to a node no better off (e2e
// TestFullLogStaysLive, CI). The leader keeps the copies it holds under
// the ballot reported, so a follower that accepted the same value from the
// old leader catches it up without storing it again (handleCatchup), and
// stores the values it lacks under its own ballot, as a catch-up does: no
// acceptor stores an entry under a ballot below its promise.
//
// Why a kept copy is safe: the entry (slot s, ballot b, value v) is one
// this node accepted, or stored from a catch-up of v under b. Either way
// it is the only value any proposer sent for s under b, and v is chosen at
// s; keeping it changes nothing a later phase 1 can find.

// chosenPrefixEnd returns the last slot of the run from c.from of slots
// whose adopted values a promiser reported committed (c.from-1 if none).
func (c *candidate) chosenPrefixEnd() Slot {
	if TestingReproposeChosen {
		return c.from - 1
	}
	s := c.from
	for ; s <= c.maxSlot; s++ {
		if v, ok := c.values[s]; !ok || !v.chosen {
			break
		}
	}
	return s - 1
}

// commitChosenPrefix commits the candidate's chosen prefix (its phase 1
// complete, the node about to lead) and moves phase 2's first slot past it.
// A value the node lacks is stored under its ballot as an ordinary
// acceptance (durable before the Ready's messages leave, delivered once it
// is), as a catch-up's chosen values are.
func (n *Node) commitChosenPrefix() {
	c := n.cand
	if n.commit+1 != c.from {
		return // cannot happen: a candidate's commit index stands still
	}
	end := c.chosenPrefixEnd()
	for s := c.from; s <= end; s++ {
		e := c.values[s].e
		if !n.holds(&e) {
			e.Ballot = c.ballot
			rec := n.markHeld(e, false)
			n.log.set(e)
			n.accepted = append(n.accepted, rec)
			n.noteKnown(&e)
		}
		n.advanceCommit()
	}
	c.from = end + 1
}

// chosenPrefixBytes is the ring space the chosen prefix takes to store: the
// values the node does not hold under the ballot reported.
func (n *Node) chosenPrefixBytes(end Slot) int64 {
	var need int64
	for s := n.cand.from; s <= end; s++ {
		if e := n.cand.values[s].e; !n.holds(&e) {
			need += n.storeBytes(&e)
		}
	}
	return need
}

// CatchupHolds reports whether a catch-up from the leader of ballot b that
// carries e stores nothing new here: the node holds e's slot under the
// ballot the leader holds it (a value the leader committed without
// re-proposing it), or under b (a value it accepted from that leader).
// A read; it may be called between inputs.
func (n *Node) CatchupHolds(e *Entry, b Ballot) bool {
	if n.holds(e) && !TestingReproposeChosen {
		return true
	}
	r := *e
	r.Ballot = b
	return n.holds(&r)
}
