package paxossim

import (
	"slices"

	"synod/paxos"
)

// The leader's own acceptances (Ready.OwnAccepted) are persisted the way
// the replica runtime persists them: in parallel with sending, finishing
// late. Each Ready's OwnAccepted becomes one write that completes after a
// seed-chosen delay, so writes finish out of order with the Accepts that
// left before them (a follower's Accepted often arrives first), and out of
// order with each other. When a write completes, its entries become
// durable (unless a later acceptance of the slot already is: a node's
// acceptances of one slot carry non-decreasing ballots, so the higher
// ballot wins, as the runtime's log in Ready order does), Options.
// OnOwnDurable is called, and only then the node is told
// (OwnAcceptedDurable). A crash loses the writes still in flight, except
// that on some seeds a write survives unreported (it reached the medium,
// the report did not come).
//
// With FaultPersist, some writes are slow (longer than an election
// timeout: a stalled msync) and a leader is crashed right after the
// Accepts of a Ready with own acceptances left, before its write completed
// (crashAfterSend): the schedule in which a leader that counted its vote
// early would lose a value it had counted.
const (
	ownWriteMicrosMax     = 1500                              // usual own write: up to 1.5 ticks
	ownSlowWritePPM       = 30_000                            // FaultPersist: a write stalls
	ownSlowWriteMicrosMax = 3 * electionTicks * microsPerTick // a stalled write, up to three election timeouts
	ownSurvivePPM         = 300_000                           // on seeds where writes survive crashes: each does
	crashAfterSendOdds    = 3                                 // FaultPersist: one crash in this many strikes after a leader's sends
	// FaultPersist with FaultCrash: chance per tick that a leader whose
	// oldest write in flight was issued at least a heartbeat ago crashes
	// (its followers may have learned commits that counted on it).
	crashInFlightPerTickPPM = 20_000
)

// ownWrite is one Ready's OwnAccepted on its way to the durable store.
type ownWrite struct {
	entries []paxos.Entry // deep copies
	doneAt  int64         // micro-ticks
	issued  int64         // micro-ticks
	seq     uint64        // issue order, for the out-of-order count
}

// ownAccepted schedules the write of rd.OwnAccepted, after the Ready's
// synchronous part is durable and before its messages go out. It checks
// the part of the contract the caller can see.
func (s *sim) ownAccepted(sn *simNode, rd *paxos.Ready) {
	own := rd.OwnAccepted
	if len(own) == 0 {
		return
	}
	b := own[0].Ballot
	for i := range own {
		e := &own[i]
		if e.Ballot != b || (i > 0 && e.Slot != own[i-1].Slot+1) {
			s.chk.violate("node %d: Ready.OwnAccepted is not one ballot in contiguous slots: %v at slot %d after %v at %d",
				sn.id, e.Ballot, e.Slot, own[max(i-1, 0)].Ballot, own[max(i-1, 0)].Slot)
		}
		if e.Ballot.Less(sn.store.promised) {
			s.chk.violate("node %d: own acceptance of slot %d under ballot %v below its durable promise %v", sn.id, e.Slot, e.Ballot, sn.store.promised)
		}
	}
	if b.Node != sn.id {
		s.chk.violate("node %d: Ready.OwnAccepted under another node's ballot %v", sn.id, b)
	}
	w := &ownWrite{seq: sn.ownSeq, issued: s.now}
	sn.ownSeq++
	for _, e := range own {
		w.entries = append(w.entries, cloneEntry(e))
	}
	d := s.r.between(0, s.ownWriteMicros)
	if s.faults.Has(FaultPersist) && s.r.ppm(ownSlowWritePPM) {
		d = s.r.between(electionTicks*microsPerTick, ownSlowWriteMicrosMax)
		s.result.Counts.OwnWritesSlow++
	}
	w.doneAt = s.now + d
	sn.ownWrites = append(sn.ownWrites, w)
	s.result.Counts.OwnWrites++
}

// ownWritesDue completes sn's own writes due by now, earliest first, and
// tells the node about each (it is not paused: a stopped process reports
// nothing, and on resuming it gets its owed ticks first).
func (s *sim) ownWritesDue(sn *simNode) {
	for sn.up() && len(sn.ownWrites) > 0 {
		i := slices.IndexFunc(sn.ownWrites, func(w *ownWrite) bool { return w.doneAt <= s.now })
		if i < 0 {
			return
		}
		for j, w := range sn.ownWrites {
			if w.doneAt <= s.now && (w.doneAt < sn.ownWrites[i].doneAt || w.doneAt == sn.ownWrites[i].doneAt && w.seq < sn.ownWrites[i].seq) {
				i = j
			}
		}
		w := sn.ownWrites[i]
		sn.ownWrites = slices.Delete(sn.ownWrites, i, i+1)
		if w.seq != sn.ownDone {
			s.result.Counts.OwnWritesReordered++
		}
		sn.ownDone = max(sn.ownDone, w.seq+1)
		s.writeOwn(sn, w)
		first, last := w.entries[0].Slot, w.entries[len(w.entries)-1].Slot
		b := w.entries[0].Ballot
		if s.opts.OnOwnDurable != nil {
			s.opts.OnOwnDurable(sn.id, b, first, last)
		}
		sn.n.OwnAcceptedDurable(b, first, last)
		s.process(sn)
	}
}

// writeOwn makes w's entries durable, each unless a later acceptance of its
// slot already is, and records them with the checker.
func (s *sim) writeOwn(sn *simNode, w *ownWrite) {
	for i := range w.entries {
		e := &w.entries[i]
		stored, why := sn.store.persistOwn(e)
		if why != "" {
			s.chk.violate("node %d: durability: %s", sn.id, why)
		}
		if !stored {
			s.result.Counts.OwnWritesSuperseded++
			continue
		}
		if !e.Held.IsZero() {
			s.result.Counts.Reballots++
		}
		s.chk.accepted(sn.id, e)
	}
}

// crashInFlight crashes, now and then, a leader with an own write in
// flight for at least a heartbeat period (FaultPersist with FaultCrash).
func (s *sim) crashInFlight() {
	if !s.r.ppm(s.rate(crashInFlightPerTickPPM)) {
		return
	}
	for _, sn := range s.nodes {
		if !sn.up() || sn.paused() || len(sn.ownWrites) == 0 || sn.n.Status().Role != paxos.RoleLeader {
			continue
		}
		oldest := sn.ownWrites[0].issued
		for _, w := range sn.ownWrites {
			oldest = min(oldest, w.issued)
		}
		if s.now-oldest >= heartbeatTicks*microsPerTick {
			s.result.Counts.CrashesInFlight++
			s.crash(sn, s.r.between(downTicksMin, downTicksMax))
			return
		}
	}
}

// loseOwnWrites runs when sn crashes: the writes in flight are lost, or on
// some seeds survive unreported.
func (s *sim) loseOwnWrites(sn *simNode) {
	for _, w := range sn.ownWrites {
		if s.ownSurvive && s.r.ppm(ownSurvivePPM) {
			s.writeOwn(sn, w)
			s.result.Counts.OwnWritesSurvived++
			continue
		}
		s.result.Counts.OwnWritesLost++
	}
	sn.ownWrites = nil
}

// persistOwn records e as durable unless the slot holds a later
// acceptance; it reports whether it did, and names a re-ballot without
// its base (resolve).
func (st *durableStore) persistOwn(e *paxos.Entry) (stored bool, why string) {
	if old, ok := st.accepted[e.Slot]; ok && e.Ballot.Less(old.Ballot) {
		return false, ""
	}
	st.accepted[e.Slot], why = st.resolve(*e)
	return true, why
}
