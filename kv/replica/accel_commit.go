package replica

import (
	"synod/accel"
	"synod/paxos"
)

// proposedRow is one aggregator row's companion in the runtime: the entry
// the leader proposed at (slot, ballot), copied when it was armed.
type proposedRow struct {
	slot      paxos.Slot
	ballot    paxos.Ballot
	used      bool         // the row holds (slot, ballot)
	entry     *paxos.Entry // nil: the Accepts of (slot, ballot) not sent yet
	durable   bool         // the leader's own acceptance is durable (accel_own.go)
	armed     bool         // Arm came: sent and durable
	committed bool         // the plane's OutCommit for (slot, ballot) came
	// early holds the senders of Accepteds that came before the Arm
	// (accel_own.go; at most earlyAcksPerRowMax).
	early []paxos.NodeID
}

// sending keeps a copy of each entry of every Accept and arms the
// aggregator for those whose own acceptance is already durable, the rest
// when it becomes durable (accel_own.go) (consensus loop, before sending).
func (a *accelMirror) sending(msgs []paxos.Message) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range msgs {
		m := &msgs[i]
		if m.Type != paxos.MsgAccept || m.Reject {
			continue
		}
		for j := range m.Entries {
			e := &m.Entries[j]
			// A new (slot, ballot) takes the row over, as Arm replaces
			// the aggregator's row.
			row := a.rowLocked(e.Slot, m.Ballot)
			if row == nil {
				continue
			}
			if row.entry == nil {
				cp := copyEntries(m.Entries[j : j+1])[0]
				row.entry = &cp
			}
			a.maybeArmLocked(row)
		}
	}
	a.flushLocked()
	a.earlyApplyLocked()
}

// accepted feeds an Accepted to the aggregator (receive loop, before the
// message is queued for the consensus loop). early says the caller may
// hand committed slots to the apply loop (the datagram receive loop, which
// stops before the apply queue closes).
func (a *accelMirror) accepted(m *paxos.Message, early bool) {
	if m.Type != paxos.MsgAccepted || m.Reject {
		return
	}
	last := max(m.Index, m.Slot)
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.buf)
	// The slots sent and not armed yet hold their Accepted for the Arm
	// (accel_own.go); the rest go to the plane in runs. Rows are matched
	// within one window of m.Slot (a row holds one slot of the window).
	run := m.Slot
	scanTo := min(last, m.Slot+a.mask)
	for s := m.Slot; s <= scanTo && s >= m.Slot; s++ {
		if !a.holdEarlyLocked(s, m.Ballot, m.From) {
			continue
		}
		if run < s {
			a.buf = a.plane.OnAcceptedRange(a.buf, run, s-1, m.Ballot, m.From)
		}
		run = s + 1
	}
	if run <= last && run >= m.Slot {
		a.buf = a.plane.OnAcceptedRange(a.buf, run, last, m.Ballot, m.From)
	}
	a.noteCommitsLocked(a.buf[n:])
	a.flushLocked()
	if early {
		a.earlyApplyLocked()
	}
}

// noteCommitsLocked marks the rows the plane committed.
func (a *accelMirror) noteCommitsLocked(evs []accel.Event) {
	for _, ev := range evs {
		if ev.Kind != accel.OutCommit {
			continue
		}
		row := &a.props[ev.Slot&a.mask]
		if row.entry != nil && row.slot == ev.Slot && row.ballot == ev.Ballot {
			row.committed = true
		}
	}
}

// earlyApplyLocked hands the apply loop every slot the plane committed
// that directly follows what was already handed to it, in slot order.
//
// Safety: a row is committed only by the plane's OutCommit for (slot,
// ballot), i.e. a majority of acceptors (this leader included, armed after
// its own acceptance was durable) accepted (slot, ballot), and the value
// of (slot, ballot) is the entry this leader proposed at that ballot, which
// the row holds: so the slot's value is chosen and known. Order: the
// early path starts at max(earlyNext, delivered+1); every lower slot was
// queued before, by this path or by the consensus loop (which stores
// delivered after queueing), so the apply loop, which skips slots at or
// below its applied slot, applies every slot exactly once and in order.
// Membership changes are left to the consensus loop (paxos must see them
// commit first).
func (a *accelMirror) earlyApplyLocked() {
	if a.r.applyBacklog.waiting.Load() > 0 {
		return // the apply loop is behind: the consensus loop delivers, in order (apply_backlog.go)
	}
	next := max(a.earlyNext, paxos.Slot(a.delivered.Load())+1)
	first := next
	var batch []paxos.Entry
	for len(batch) < proposeBatchCmdsMax {
		row := &a.props[next&a.mask]
		if !row.used || row.entry == nil || row.slot != next || !row.committed || row.entry.Type == paxos.EntryConfChange {
			break
		}
		batch = append(batch, *row.entry)
		next++
	}
	if len(batch) == 0 {
		return
	}
	select {
	case a.r.applyC <- applyItem{entries: batch, queued: a.r.stageNow()}:
		a.earlyNext = next
		a.earlyApplied.Add(uint64(next - first))
	default:
		// The apply loop is behind: the consensus loop delivers these.
	}
}

// deliveredThrough records that the consensus loop queued every slot up to
// s for the apply loop.
func (a *accelMirror) deliveredThrough(s paxos.Slot) {
	if uint64(s) > a.delivered.Load() {
		a.delivered.Store(uint64(s))
	}
}
