package paxossim

import (
	"slices"

	"synod/paxos"
)

// process drains sn's Ready as the contract says: persist, send, apply,
// Advance. The simulator runs it after every input it gives a node.
func (s *sim) process(sn *simNode) {
	for i := 0; sn.up() && sn.n.HasReady(); i++ {
		if i == readyLoopsMax {
			s.chk.violate("node %d: still HasReady after %d Ready rounds", sn.id, readyLoopsMax)
			return
		}
		rd := sn.n.Ready()
		s.handleReady(sn, &rd)
		if !sn.up() {
			return // crashed inside the Ready
		}
		sn.n.Advance(rd)
		if rd.SnapshotOffer != nil {
			s.offered(sn, rd.SnapshotOffer)
		}
	}
	if sn.up() {
		s.checkLeases()
	}
	if (s.opts.Trace != nil || s.opts.OnStatus != nil) && sn.up() {
		st := sn.n.Status()
		if s.opts.OnStatus != nil {
			s.opts.OnStatus(sn.id, &st)
		}
		if s.opts.Trace != nil && (st.Role != sn.lastRole || st.Ballot != sn.lastBallot) {
			s.tracef("node %d: %s ballot=%d.%d promised=%d.%d commit=%d members=%v", sn.id, st.Role,
				st.Ballot.Round, st.Ballot.Node, st.Promised.Round, st.Promised.Node, st.Commit, st.Members)
			sn.lastRole, sn.lastBallot = st.Role, st.Ballot
		}
	}
}

func (s *sim) handleReady(sn *simNode, rd *paxos.Ready) {
	// 1. Durable first. An acceptor's promise never goes down, and it
	// never accepts under a ballot below what it had durably promised.
	if rd.Promised != nil && rd.Promised.Less(sn.store.promised) {
		s.chk.violate("node %d: promised ballot went down from %v to %v", sn.id, sn.store.promised, *rd.Promised)
	}
	for i := range rd.Accepted {
		if e := &rd.Accepted[i]; e.Ballot.Less(sn.store.promised) {
			s.chk.violate("node %d: accepted slot %d under ballot %v below its durable promise %v", sn.id, e.Slot, e.Ballot, sn.store.promised)
		}
	}
	bad, reballots := sn.store.persist(rd)
	for _, why := range bad {
		s.chk.violate("node %d: durability: %s", sn.id, why)
	}
	s.result.Counts.Reballots += reballots
	for i := range rd.Accepted {
		s.chk.accepted(sn.id, &rd.Accepted[i])
	}
	// The leader's own acceptances are written in parallel with sending.
	s.ownAccepted(sn, rd)
	if sn.crashMidReady {
		s.crash(sn, s.r.between(downTicksMin, downTicksMax))
		return
	}
	s.noteLeaderConfChanges(sn, rd)
	// 2. Then send.
	for i := range rd.Messages {
		m := &rd.Messages[i]
		if m.From != sn.id {
			s.chk.violate("node %d sent a message claiming to be from %d", sn.id, m.From)
		}
		s.checkAcceptPastConfChange(sn, m)
		s.net.send(s.r, s.now+s.leaseStressDelay(m), m.From, m.To, paxos.AppendMessage(nil, m))
	}
	if sn.crashAfterSend && len(rd.OwnAccepted) > 0 {
		s.result.Counts.CrashesAfterSend++
		s.crash(sn, s.r.between(downTicksMin, downTicksMax))
		return
	}
	// 3. Install the snapshot, then apply.
	if rd.Snapshot != nil {
		s.installSnapshot(sn, *rd.Snapshot)
	}
	if len(rd.Committed) > 0 {
		for i := range rd.Committed {
			s.apply(sn, &rd.Committed[i])
		}
		if s.appDurableEveryApply {
			sn.store.appState = sn.app.encode()
		}
	}
	for i := range rd.AckEvents {
		s.chk.ack(sn.id, &rd.AckEvents[i])
		s.noteCommit(&rd.AckEvents[i])
	}
	for _, rs := range rd.ReadStates {
		s.leaseRead(sn, rs)
		s.readState(sn, rs)
	}
	if s.opts.OnReady != nil {
		s.opts.OnReady(sn.id, rd)
	}
}

// installSnapshot swaps in the staged copy a Ready names (the install
// InstallSnapshot accepted).
func (s *sim) installSnapshot(sn *simNode, meta paxos.SnapshotMeta) {
	st := sn.store.staged
	if st == nil || st.meta.Slot != meta.Slot {
		s.chk.violate("node %d: Ready names snapshot %d, but the staged copy is %+v", sn.id, meta.Slot, st)
		return
	}
	sn.store.staged = nil
	app, err := decodeKVApp(st.data)
	if err != nil {
		s.chk.violate("node %d: snapshot at slot %d does not decode: %v", sn.id, meta.Slot, err)
		return
	}
	if app.applied != meta.Slot {
		s.chk.violate("node %d: snapshot meta slot %d but its data is at slot %d", sn.id, meta.Slot, app.applied)
	}
	if !slices.Equal(meta.Members, app.members) || !slices.Equal(meta.Learners, app.learners) {
		// The application applied every ConfChange through the snapshot's
		// slot, so it knows the membership in force after it.
		s.chk.violate("node %d: snapshot at slot %d carries members %v learners %v, but the membership after slot %d is %v learners %v",
			sn.id, meta.Slot, meta.Members, meta.Learners, meta.Slot, app.members, app.learners)
	}
	if meta.Slot <= sn.app.applied {
		s.chk.violateSafety("node %d: snapshot at slot %d would roll back applied state at %d", sn.id, meta.Slot, sn.app.applied)
		return
	}
	s.tracef("node %d: install snapshot at slot %d", sn.id, meta.Slot)
	sn.app = app
	s.result.Counts.SnapshotsInstalled++
	s.noteMembers(app.applied, app.members, app.learners)
	sn.store.saveSnapshot(meta, st.data)
	sn.store.truncate(meta.Slot)
	if s.appDurableEveryApply {
		sn.store.appState = slices.Clone(st.data)
	}
	s.chk.state(sn.id, meta.Slot, app.hash())
}

func (s *sim) apply(sn *simNode, e *paxos.Entry) {
	app := sn.app
	if e.Slot != app.applied+1 {
		s.chk.violate("node %d: committed slot %d delivered after applied %d (gap, repeat or reorder)", sn.id, e.Slot, app.applied)
		if e.Slot <= app.applied {
			return
		}
	}
	switch e.Type {
	case paxos.EntryNormal:
		for _, b := range e.Cmds {
			c, err := decodeCommand(b)
			if err != nil {
				s.chk.violate("node %d: slot %d holds a command that does not decode: %v", sn.id, e.Slot, err)
				continue
			}
			app.applyCommand(&c)
		}
	case paxos.EntryConfChange:
		s.applyConfChange(sn, e)
	case paxos.EntryNoop:
	default:
		s.chk.violate("node %d: slot %d has unknown entry type %d", sn.id, e.Slot, e.Type)
	}
	if s.opts.plantDivergence == sn.id && e.Slot%7 == 0 {
		app.data[keyNames[0]] += "!" // the planted bug: this replica diverges
	}
	app.applied = e.Slot
	s.noteMembers(e.Slot, app.members, app.learners)
	if e.Slot > s.result.Commit {
		s.result.Commit = e.Slot
	}
	s.chk.applied(sn.id, e, app.hash())
}
