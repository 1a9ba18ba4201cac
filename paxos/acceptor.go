package paxos

// acceptAheadSlotsMax bounds how far above its commit index an acceptor
// stores accepted entries; beyond it the acceptor waits for catch-up, so a
// far-behind acceptor cannot be made to allocate an unbounded log.
const acceptAheadSlotsMax = 4 * inflightSlotsMax

// leaseBlocks reports whether a lease this acceptor granted forbids it to
// promise or accept a higher ballot from node from.
func (n *Node) leaseBlocks(from NodeID) bool {
	return n.cfg.LeaseTicks > 0 && n.now < n.leaseUntil && n.leaseHolder != from
}

// raisePromise records a promise of b (> promised) and steps down when b
// outbids this node's own ballot.
func (n *Node) raisePromise(b Ballot) {
	if n.promised.Less(b) {
		n.promised = b
		n.promisedDirty = true
	}
	if (n.role == RoleLeader && n.lead.ballot.Less(b)) || (n.role == RoleCandidate && n.cand.ballot.Less(b)) {
		n.becomeFollower()
	}
}

// admitProposer runs the checks shared by every message a proposer sends
// under its ballot: lower ballots are refused, higher ones raise the promise
// unless a lease forbids it. It returns false when the message is refused.
func (n *Node) admitProposer(m *Message) bool {
	if m.Ballot.Less(n.promised) {
		return false
	}
	if n.promised.Less(m.Ballot) {
		if n.leaseBlocks(m.From) {
			return false
		}
		n.raisePromise(m.Ballot)
	}
	return true
}

// followLeader notes that from leads under the promised ballot.
func (n *Node) followLeader(from NodeID) {
	if n.role != RoleFollower {
		n.becomeFollower()
	}
	n.leader = from
	n.lastLeaderTick = n.now
	n.electionElapsed = 0
	n.deferringSince = -1 // a leader exists: a later deferral starts over (logroom.go)
}

func (n *Node) handlePrepare(m *Message) {
	refuse := func() {
		n.send(Message{Type: MsgPromise, To: m.From, Ballot: n.promised, Slot: m.Slot, Commit: n.commit, Reject: true})
	}
	if m.Ballot.Less(n.promised) {
		refuse()
		return
	}
	if m.Slot < n.log.first {
		// This acceptor compacted slots the candidate has not committed:
		// it cannot report them, so it cannot promise usefully. Offer the
		// snapshot, so the candidate catches up (and learns the current
		// membership, which may not even include it). It refuses before
		// raising its promise: a candidate that cannot win here must not
		// depose this node's leader or hold back its election timer (a
		// lagging candidate re-campaigning under ever higher ballots
		// otherwise kept every acceptor promised to it).
		refuse()
		n.offerSnapshot(m.From)
		return
	}
	if n.promised.Less(m.Ballot) {
		if n.leaseBlocks(m.From) {
			refuse()
			return
		}
		n.raisePromise(m.Ballot)
		if n.role != RoleFollower {
			n.becomeFollower()
		}
		n.leader = 0
		n.electionElapsed = 0
	}
	last := n.log.last()
	through := min(last, m.Slot+EntriesPerMessageMax-1)
	var ents []Entry
	size := 0
	for s := m.Slot; s <= through; s++ {
		if e := n.log.get(s); e != nil {
			if size += entryBytes(e); size > messageEntryBytesMax && len(ents) > 0 {
				through = s - 1 // the rest goes in the next chunk
				break
			}
			ents = append(ents, *e)
		}
	}
	if through < m.Slot {
		through = m.Slot - 1
	}
	n.send(Message{Type: MsgPromise, To: m.From, Ballot: m.Ballot, Slot: m.Slot, Index: through, Last: max(last, through),
		Commit: n.commit, Entries: ents})
}

// holds reports whether the log already holds e's slot at e's ballot. A
// proposer sends one value per (slot, ballot), so the entry is the same,
// and it is durable or in the pending Ready: a resent Accept is answered
// without persisting the entry again (a retransmitted megabyte entry would
// otherwise fill the acceptor log with copies).
// Holds is holds for the application: an Accept of e (or a catch-up of
// it, under the sender's ballot) stores nothing new, so admitting it
// takes no log room. A read; it may be called between inputs.
func (n *Node) Holds(e *Entry) bool { return n.holds(e) }

func (n *Node) holds(e *Entry) bool {
	old := n.log.get(e.Slot)
	return old != nil && old.Ballot == e.Ballot && old.Type == e.Type
}

func (n *Node) handleAccept(m *Message) {
	if !n.admitProposer(m) {
		n.send(Message{Type: MsgAccepted, To: m.From, Ballot: n.promised, Slot: 1, Index: 1, Commit: n.commit, Reject: true})
		return
	}
	n.followLeader(m.From)
	if n.joining {
		return // nothing is stored before the snapshot (join.go)
	}
	var first, last Slot
	for i := range m.Entries {
		e := m.Entries[i]
		if e.Slot > n.commit+acceptAheadSlotsMax {
			break
		}
		if e.Slot > n.commit && !n.holds(&e) {
			rec := n.markHeld(e, false)
			n.log.set(e)
			n.accepted = append(n.accepted, rec)
			n.noteKnown(&e)
		}
		if first == 0 {
			first = e.Slot
		}
		last = e.Slot
	}
	n.learnCommit(m.Commit, m.Ballot)
	if first != 0 {
		n.send(Message{Type: MsgAccepted, To: m.From, Ballot: m.Ballot, Slot: first, Index: last, Commit: n.commit})
	}
}

func (n *Node) handleHeartbeat(m *Message) {
	if !n.admitProposer(m) {
		n.send(Message{Type: MsgHeartbeatResp, To: m.From, Ballot: n.promised, Context: m.Context, Commit: n.commit, Reject: true})
		return
	}
	n.followLeader(m.From)
	if n.cfg.LeaseTicks > 0 {
		// The lease runs from receipt, which is no earlier than the
		// leader's send: the leader's own view of it ends sooner.
		n.leaseHolder = m.From
		n.leaseUntil = n.now + int64(n.cfg.LeaseTicks)
	}
	n.learnCommit(m.Commit, m.Ballot)
	n.send(Message{Type: MsgHeartbeatResp, To: m.From, Ballot: m.Ballot, Context: m.Context, Commit: n.commit})
}

func (n *Node) handleCatchup(m *Message) {
	if !n.admitProposer(m) {
		return
	}
	n.followLeader(m.From)
	for i := 0; i < len(m.Entries) && !n.joining; i++ {
		e := m.Entries[i]
		if e.Slot <= n.commit {
			continue
		}
		if e.Slot != n.commit+1 {
			break
		}
		// The value is chosen. A copy held under the ballot the leader
		// holds it (chosen_prefix.go) or under the leader's ballot is that
		// value: nothing to store. Otherwise store it under the sender's
		// ballot, which is at least the ballot it was chosen under, so a
		// later phase 1 that sees this entry still finds the chosen value
		// at the top.
		if !n.CatchupHolds(&e, m.Ballot) {
			e.Ballot = m.Ballot
			rec := n.markHeld(e, false)
			n.log.set(e)
			n.accepted = append(n.accepted, rec)
			n.noteKnown(&e)
		}
		n.advanceCommit()
	}
	n.learnCommit(m.Commit, m.Ballot)
	n.send(Message{Type: MsgHeartbeatResp, To: m.From, Ballot: m.Ballot, Commit: n.commit})
}

func (n *Node) handleSnapshot(m *Message) {
	fromLeader := !m.Ballot.IsZero()
	if fromLeader {
		if !n.admitProposer(m) {
			return
		}
		n.followLeader(m.From)
	}
	// The state itself is fetched by the application (Ready.SnapshotOffer,
	// then InstallSnapshot); the newest offer above commit waits for the
	// next Ready.
	if s := m.Snapshot; s.Slot > n.commit && (n.snapOffer == nil || s.Slot >= n.snapOffer.Meta.Slot) {
		n.snapOffer = &SnapshotOffer{From: m.From, Meta: cloneSnapshotMeta(*s)}
	}
	if fromLeader {
		n.learnCommit(m.Commit, m.Ballot)
		n.send(Message{Type: MsgHeartbeatResp, To: m.From, Ballot: m.Ballot, Commit: n.commit})
	}
}

// offerSnapshot sends this node's snapshot to a node found lagging below
// its compaction point, at most once per election timeout per node.
func (n *Node) offerSnapshot(to NodeID) {
	if n.snap == nil {
		return
	}
	if t, ok := n.snapOffered[to]; ok && n.now-t < int64(n.cfg.ElectionTicks) {
		return
	}
	if n.snapOffered == nil {
		n.snapOffered = map[NodeID]int64{}
	}
	n.snapOffered[to] = n.now
	n.send(Message{Type: MsgSnapshot, To: to, Commit: n.commit, Snapshot: n.snap})
}

// learnCommit advances the commit index toward c, told by the leader of
// ballot b. A slot commits here only when this acceptor holds the value
// accepted under b: the leader proposes one value per slot under b, and
// every slot at or below its commit index that it proposed holds the chosen
// value. Anything else waits for catch-up.
func (n *Node) learnCommit(c Slot, b Ballot) {
	for n.commit < c {
		e := n.log.get(n.commit + 1)
		if e == nil || e.Ballot != b {
			return
		}
		n.advanceCommit()
	}
}

// advanceCommit commits slot commit+1, whose chosen value this node holds.
func (n *Node) advanceCommit() {
	s := n.commit + 1
	e := n.log.get(s)
	if e == nil {
		n.invariantf("committing slot %d without an entry", s)
	}
	n.commit = s
	n.commitConf(e)
	if n.role == RoleLeader {
		n.leaderCommitted(s, e)
	}
}

// commitConf applies a committed ConfChange: the new membership governs the
// slots above it.
func (n *Node) commitConf(e *Entry) {
	cc, ok := entryConfChange(e)
	if !ok {
		return
	}
	voters, learners, err := applyConfChange(n.conf.at(e.Slot), n.conf.learnersAt(e.Slot), cc)
	if err != nil {
		// Every replica reaches the same verdict on the same bytes.
		return
	}
	n.conf.add(e.Slot+1, voters, learners)
	n.known[cc.Node] = true
}
