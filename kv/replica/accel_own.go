package replica

import (
	"slices"

	"synod/accel"
	"synod/paxos"
)

// The leader's own vote on the plane.
//
// The aggregator's Arm counts the leader's own acceptance of (slot,
// ballot), so, exactly as paxos counts it only after OwnAcceptedDurable
// (paxos ownvote.go), the runtime arms a row only once the leader both
// sent its Accepts for it (sending, consensus loop) and made its own
// acceptance durable (ownDurable: the persister, or a synchronous persist
// on the consensus loop), whichever comes last. The two race: the
// persister may finish before the consensus loop reaches sending.
//
// A follower's write often finishes before the leader's own, so its
// Accepted may reach the receive loop while the row is sent but not yet
// armed. Fed to the plane then, Arm would reset the row and drop it; so
// such Accepteds are held in the row (at most earlyAcksPerRowMax senders)
// and fed right after the Arm. A row that never gets armed (the leader
// stopped leading, or crashed, before its write completed) while holding
// Accepteds is reported to the checker as withheld: like a hand-up, it
// excuses a commit only software made (software may count a quorum of
// followers alone), never one only the plane made.

// earlyAcksPerRowMax bounds the Accepteds held in one row waiting for its
// Arm: one per member the plane's table can hold (duplicates are dropped).
const earlyAcksPerRowMax = accel.ReplicasMax

// rowLocked returns the row for (s, b), taking it over from an older
// (slot, ballot) if need be, or nil when the row holds a newer one (a late
// report of a superseded write). Caller holds a.mu.
func (a *accelMirror) rowLocked(s paxos.Slot, b paxos.Ballot) *proposedRow {
	row := &a.props[s&a.mask]
	if row.used && row.slot == s && row.ballot == b {
		return row
	}
	if row.used && (row.slot > s || (row.slot == s && b.Less(row.ballot))) {
		return nil
	}
	a.releaseLocked(row)
	*row = proposedRow{used: true, slot: s, ballot: b}
	return row
}

// releaseLocked gives up a row: Accepteds it held for an Arm that never
// came excuse a software-only commit of its (slot, ballot).
func (a *accelMirror) releaseLocked(row *proposedRow) {
	if row.used && !row.armed && len(row.early) > 0 {
		a.check.withheld(row.slot, row.ballot)
	}
	row.early = nil
}

// maybeArmLocked arms row once it was sent and is durable, then feeds the
// Accepteds that came for it before.
func (a *accelMirror) maybeArmLocked(row *proposedRow) {
	if row.armed || row.entry == nil || !row.durable {
		return
	}
	row.armed = true
	n := len(a.buf)
	a.buf = a.plane.Arm(a.buf, row.slot, row.ballot)
	for _, from := range row.early {
		a.buf = a.plane.OnAccepted(a.buf, row.slot, row.ballot, from)
	}
	row.early = nil
	a.noteCommitsLocked(a.buf[n:])
}

// ownDurable records that the leader's own acceptances in rgs are durable
// (the persister, or the consensus loop after a synchronous persist;
// before paxos is told): the rows already sent are armed now, the others
// when they are sent.
func (a *accelMirror) ownDurable(rgs []ownRange) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, rg := range rgs {
		first := rg.first
		if rg.last-first >= a.mask {
			first = rg.last - a.mask // older slots' rows were taken over
		}
		for s := first; s <= rg.last; s++ {
			if row := a.rowLocked(s, rg.b); row != nil {
				row.durable = true
				a.maybeArmLocked(row)
			}
		}
	}
	a.flushLocked()
	a.earlyApplyLocked()
}

// holdEarlyLocked keeps from's Accepted of (s, b) for the row's Arm when
// the row was sent and not armed yet; it reports whether it did.
func (a *accelMirror) holdEarlyLocked(s paxos.Slot, b paxos.Ballot, from paxos.NodeID) bool {
	row := &a.props[s&a.mask]
	if !row.used || row.slot != s || row.ballot != b || row.armed || row.entry == nil {
		return false
	}
	if !slices.Contains(row.early, from) && len(row.early) < earlyAcksPerRowMax {
		row.early = append(row.early, from)
	}
	return true
}

// releaseUnarmed gives up every row sent under a ballot other than
// current that is still waiting for its Arm (consensus loop, when the
// node's leadership changed: those writes will never be reported durable
// while it leads at their ballot).
func (a *accelMirror) releaseUnarmed(current paxos.Ballot) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range a.props {
		if row := &a.props[i]; row.used && !row.armed && row.ballot != current {
			a.releaseLocked(row)
		}
	}
}

// excuseWaiting reports every row still waiting for its Arm with
// Accepteds held as withheld (at the end of a run, before the verdict).
func (a *accelMirror) excuseWaiting() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range a.props {
		if row := &a.props[i]; row.used && !row.armed && len(row.early) > 0 {
			a.check.withheld(row.slot, row.ballot)
		}
	}
}
