package replica

import (
	"errors"

	"synod/paxos"
	"synod/pmem"
)

// The leader's own acceptances that do not fit in the acceptor log wait
// for room instead of stalling the consensus loop.
//
// A leader's own acceptance (Ready.OwnAccepted) need not be durable before
// its Accepts leave, only before its vote counts (paxos ownvote.go). Once
// a Ready stalled on its own entries as on any other: the consensus loop
// took no input until they fitted. That wedged a pair of survivors for
// good (TestFullLogStaysLive, once in CI and once in 6 local runs): the
// leader was killed while its two followers held 75 slots of 256 KiB above
// what they knew committed; one of them, its election deferral run out,
// led anyway, its re-proposals did not fit, its Ready stalled, so it sent
// no Accept and stepped none of the other's answers; check quorum made it
// a follower, still stalled, and a stalled node answers no Prepare either,
// so the other could not be elected: no leader until the killed node came
// back. The only thing that could make room (committing those slots, then
// compacting) needed the very input the stall refused.
//
// So own entries that do not fit wait here, in Ready order, and the Ready
// goes on: its Accepts leave, its answers are stepped, the followers
// acknowledge, and the slots whose own copy is stored commit in order; the
// apply loop applies them, compaction truncates the log, and each tick
// appends the waiting entries that fit and hands them to the persister,
// which reports them durable (only then does the leader's vote count, and
// only then does this node deliver those slots: the paxos contract holds
// unchanged, the persist only takes longer). A follower's answered
// acceptances still must be durable before the answer, so they still
// stall a Ready that they do not fit (accept admission keeps that rare).
//
// Durable writes must keep Ready order per slot (paxos node.go): the
// backlog is appended in its own order, before anything handed out later
// of the same leadership, and an answered acceptance of a slot the backlog
// holds supersedes the waiting entry, which is dropped; so is one below
// the log's truncation point. A dropped entry was never durable and never
// counted as a vote; paxos is told with a report that only releases the
// slot (OwnAcceptedDurable for a slot it no longer holds at that ballot),
// after the superseding acceptance is durable.

// ownBacklog is the consensus loop's queue of own acceptances waiting for
// log room. Its length is bounded by what paxos hands out unreported: the
// re-proposals of one election, or the Ready that did not fit, since a
// leader with a backlog takes no new writes (holdProposals). It holds
// Entry headers; the commands are those paxos's log holds anyway.
type ownBacklog struct {
	entries []paxos.Entry
	// released are ranges of dropped entries to report to paxos once the
	// acceptance that superseded them is durable.
	released []ownRange
	// logged: the backlog's start was logged, its end is not yet.
	logged bool
}

// appendOwn appends the backlog's entries that fit, then own (an
// OwnAccepted), keeping whatever does not fit in the backlog in order. It
// returns the runs appended (for the persister), their last slot and the
// error of a log that failed otherwise than full.
//
// Only entries of the ballot the node leads with, or of committed slots,
// are appended: once it stopped leading, its acceptances of a later ballot
// may reach the log without passing through a Ready (the accel fast path
// appends before its mirror is stepped), and a waiting entry of an
// uncommitted slot appended after one of those would supersede it on
// recovery. Such entries wait until an acceptance of their slot supersedes
// them (supersede), their slot commits, or a snapshot covers them.
func (r *Replica) appendOwn(own []paxos.Entry) (ranges []ownRange, last paxos.Slot, err error) {
	b := &r.ownBacklog
	put := func(e *paxos.Entry) (bool, error) {
		if err := r.alog.Append([]paxos.Entry{*e}); err != nil {
			if errors.Is(err, ErrLogFull) {
				return false, nil
			}
			return false, err
		}
		ranges = addRange(ranges, ownRange{b: e.Ballot, first: e.Slot, last: e.Slot})
		last = max(last, e.Slot)
		return true, nil
	}
	leadWaits := false // an entry of the leading ballot still waits: own queues behind it
	if len(b.entries) > 0 {
		b.dropBelow(r.alog.TruncatedBelow(), r)
		b.supersedeOwn(own)
		st := r.node.Status()
		var lead paxos.Ballot
		if st.Role == paxos.RoleLeader {
			lead = st.Ballot
		}
		full := false
		kept := b.entries[:0]
		for i := range b.entries {
			e := b.entries[i]
			// A committed slot's waiting entry holds the chosen value
			// (paxos commits only over the value it holds, and an
			// acceptance that superseded it would have dropped it): any
			// record of the slot holds that value, so it may be stored
			// whatever the ballot, and must be, or the slot is never
			// delivered here.
			if !full && (e.Ballot == lead || e.Slot <= st.Commit) {
				ok, err := put(&e)
				if err != nil {
					return ranges, last, err // the replica stops
				}
				if ok {
					continue
				}
				full = true
			}
			leadWaits = leadWaits || e.Ballot == lead
			kept = append(kept, e)
		}
		clear(b.entries[len(kept):]) // drop command references
		b.entries = kept
	}
	if len(own) == 0 {
		r.noteBacklog()
		return ranges, last, nil
	}
	if testingNoOwnBacklog {
		// Planted: the whole Ready stalls on a full log.
		if err := r.alog.Append(own); err != nil {
			return ranges, last, err
		}
		return addRange(ranges, ownRange{b: own[0].Ballot, first: own[0].Slot, last: own[len(own)-1].Slot}), own[len(own)-1].Slot, nil
	}
	i := 0
	if !leadWaits {
		if len(own) <= pmem.AppendBatchRecordsMax {
			// The common case: the whole run fits (one batch, all or
			// nothing).
			if err := r.alog.Append(own); err == nil {
				ranges = addRange(ranges, ownRange{b: own[0].Ballot, first: own[0].Slot, last: own[len(own)-1].Slot})
				return ranges, max(last, own[len(own)-1].Slot), nil
			} else if !errors.Is(err, ErrLogFull) {
				return ranges, last, err
			}
		}
		for ; i < len(own); i++ {
			ok, err := put(&own[i])
			if err != nil {
				return ranges, last, err
			}
			if !ok {
				break
			}
		}
	}
	r.metrics.OwnWaits.Add(float64(len(own) - i))
	if TestingOwnWaitVotesEarly && i < len(own) {
		// Planted: reported durable while it waits (a vote not stored).
		r.own.finish([]ownRange{{b: own[i].Ballot, first: own[i].Slot, last: own[len(own)-1].Slot}})
	}
	for _, e := range own[i:] {
		// A copy of the Entry: paxos owns the Ready's slices after
		// Advance (the commands themselves are never written again).
		b.entries = append(b.entries, e)
	}
	r.noteBacklog()
	return ranges, last, nil
}

// remove drops the waiting entries whose slot match selects and returns
// them as single-slot ranges, for a release report.
func (b *ownBacklog) remove(match func(paxos.Slot) bool) (dropped []ownRange) {
	kept := b.entries[:0]
	for _, e := range b.entries {
		if match(e.Slot) {
			dropped = append(dropped, ownRange{b: e.Ballot, first: e.Slot, last: e.Slot})
			continue
		}
		kept = append(kept, e)
	}
	clear(b.entries[len(kept):]) // drop command references
	b.entries = kept
	return dropped
}

// supersedeOwn drops the waiting entries of the slots own (this Ready's
// own acceptances, of a later leadership) holds. Nothing is released:
// paxos's table of own writes not yet reported already names own's ballot
// for those slots.
func (b *ownBacklog) supersedeOwn(own []paxos.Entry) {
	if len(b.entries) == 0 || len(own) == 0 {
		return
	}
	first, last := own[0].Slot, own[len(own)-1].Slot // contiguous (paxos Ready.OwnAccepted)
	b.remove(func(s paxos.Slot) bool { return s >= first && s <= last })
}

// supersede drops the waiting entries of the slots acc (a Ready's answered
// acceptances) holds: those are later in Ready order. Their release is
// reported after acc is durable (releaseSuperseded).
func (b *ownBacklog) supersede(acc []paxos.Entry) {
	if len(b.entries) == 0 || len(acc) == 0 {
		return
	}
	slots := make(map[paxos.Slot]bool, len(acc))
	for i := range acc {
		slots[acc[i].Slot] = true
	}
	b.released = append(b.released, b.remove(func(s paxos.Slot) bool { return slots[s] })...)
}

// dropBelow drops the waiting entries below the log's truncation point
// (compacted: a snapshot covers them) and reports their release at once.
func (b *ownBacklog) dropBelow(truncated paxos.Slot, r *Replica) {
	if rel := b.remove(func(s paxos.Slot) bool { return s < truncated }); len(rel) > 0 {
		r.own.finish(rel)
	}
}

// releaseSuperseded reports the entries supersede dropped, once the
// acceptances that superseded them are durable (consensus loop).
func (r *Replica) releaseSuperseded() {
	if b := &r.ownBacklog; len(b.released) > 0 {
		r.own.finish(b.released)
		b.released = nil
	}
}

// drainOwnBacklog appends the waiting entries that fit now and hands them
// to the persister (consensus loop, on a tick, between Readys). It leaves
// the room admission promised to accepts not yet persisted alone.
func (r *Replica) drainOwnBacklog() {
	if len(r.ownBacklog.entries) == 0 || r.admit.pendingBytes > 0 {
		return
	}
	used0, _ := r.alog.Usage()
	ranges, last, err := r.appendOwn(nil)
	if err != nil {
		r.die(err)
		return
	}
	if len(ranges) == 0 {
		return
	}
	used1, capacity := r.alog.Usage()
	r.logTail.appended(used1-used0, last, capacity)
	r.queueOwn(ranges)
}

// queueOwn hands appended runs to the persister; when its queue is full
// the consensus loop persists them itself.
func (r *Replica) queueOwn(ranges []ownRange) {
	if unqueued := r.own.queueAll(ranges); len(unqueued) > 0 {
		r.persistDelay()
		if err := r.alog.Persist(); err != nil {
			r.die(err)
			return
		}
		if covered := r.own.coveredBySync(unqueued...); r.accel != nil && len(covered) > 0 {
			r.accel.ownDurable(covered)
		}
	}
}

// noteBacklog logs the backlog's start and end (consensus loop).
func (r *Replica) noteBacklog() {
	b := &r.ownBacklog
	switch {
	case len(b.entries) > 0 && !b.logged:
		b.logged = true
		r.snapshotForRoom() // compaction makes the room
		r.metrics.LogFull.Inc()
		var bytes int64
		for i := range b.entries {
			bytes += entryRingBytes(&b.entries[i])
		}
		r.log.Warn().Int("entries", len(b.entries)).Int64("bytes", bytes).
			Msg("acceptor log full: this leader's own acceptances wait for room (its vote counts once they are stored)")
	case len(b.entries) == 0 && b.logged:
		b.logged = false
		r.log.Info().Msg("acceptor log has room again: the leader's own acceptances are stored")
	}
}
