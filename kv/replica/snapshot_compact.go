package replica

import (
	"sync"
	"time"

	"synod/paxos"
)

// Compaction. Taking a snapshot never blocks the apply loop and reads no
// state: the apply loop records its applied slot and starts an
// asynchronous flush of the state machine (a memtable rotation,
// sm.FlushAsync); when the flush completes (the apply loop sees its
// channel close between inputs) the consensus loop compacts paxos through
// that slot (metadata only: the state is served from the store when a
// laggard asks, snapshot_serve.go) and the acceptor log truncates below
// it, never beyond what is durable in the store. One flush is in flight at
// a time; a request meanwhile is served by the next one.

// snapshot starts a compaction at the applied slot (apply loop).
func (r *Replica) snapshot(last *uint64) {
	as := &r.apply
	if as.flushing != nil {
		return // one at a time: the next request after it completes
	}
	slot, done, err := r.sm.FlushAsync()
	if err != nil {
		r.log.Warn().Err(err).Msg("flush before snapshot failed")
		return
	}
	*last = slot
	as.flushing, as.flushSlot = done, slot
}

// flushed runs on the apply loop once the compaction's flush completed:
// the consensus loop may compact through its slot.
func (r *Replica) flushed() {
	as := &r.apply
	slot := paxos.Slot(as.flushSlot)
	as.flushing = nil
	if slot == 0 {
		return
	}
	r.metrics.Snapshots.Inc()
	r.metrics.SnapshotSlot.Set(float64(slot))
	r.log.Debug().Uint64("slot", uint64(slot)).Msg("snapshot taken")
	// Never block here: the consensus loop may itself be blocked handing
	// this loop committed entries. A full control queue only delays
	// compaction to the next snapshot.
	select {
	case r.controlC <- func() { r.compacted(slot, slot) }:
	default:
		r.log.Warn().Uint64("slot", uint64(slot)).Msg("control queue full; compaction deferred to the next snapshot")
	}
}

// retainFloor is the slot compaction may go to instead of slot: below the
// slot of a snapshot being served, or recently served, so its fetcher
// catches up from the log; unless the acceptor log is past
// snapshotRetainLogPercentMax (consensus loop).
func (r *Replica) retainFloor(slot paxos.Slot) paxos.Slot {
	floor, ok := r.pins.floor(r.cfg.Now())
	if !ok || floor >= slot {
		return slot
	}
	used, capacity := r.alog.Usage()
	if capacity > 0 && used*100 >= capacity*snapshotRetainLogPercentMax {
		return slot
	}
	return floor
}

// catchUpFloor is the slot compaction may go through instead of slot (0:
// none): it keeps
// a catch-up tail below the snapshot in the log, so a follower that missed
// some Accepts, paused, or was down for a while when its leader compacted
// catches up from the log instead of fetching the whole store. The tail
// is the larger of two: the last every/catchUpTailDivisor slots, while
// the acceptor log is below CatchUpLogPercentMax in use (etcd keeps such a
// tail of entries), and, when Config.CatchUpLogPercent is set, as many of
// the newest slots as fit in that share of the log's capacity (log_tail.go:
// what lets a follower down for a minute under load skip the snapshot).
// Every node keeps it, not only the leader: a node that leads later
// serves the same laggards (a leader-only tail, tried first, was lost
// whenever leadership moved). A follower farther behind is served a
// snapshot (consensus loop).
//
// No tail is kept while this node's own acceptances wait for room
// (own_backlog.go): a leader that cannot store them commits nothing, and
// a tail kept for laggards (40% of the log by default) beside the old
// records of its uncommitted slots can leave no room at all.
func (r *Replica) catchUpFloor(slot paxos.Slot) paxos.Slot {
	if testingNoCatchUpTail || (len(r.ownBacklog.entries) > 0 && !testingTailKeptForBacklog) {
		return slot
	}
	floor := slot
	used, capacity := r.alog.Usage()
	if tail := paxos.Slot(r.snapshotEvery() / catchUpTailDivisor); tail > 0 && slot > tail &&
		(capacity <= 0 || used*100 < capacity*CatchUpLogPercentMax) {
		floor = slot - tail
	}
	if pct := r.cfg.CatchUpLogPercent; pct > 0 && capacity > 0 {
		// f is the lowest slot to keep; compaction goes through the one
		// below it (0: nothing to compact, which compacted handles).
		if f, ok := r.logTail.floor(capacity * int64(pct) / 100); ok {
			floor = min(floor, f-1)
		}
	}
	return floor
}

// snapPinsMax bounds the log pins held at once: snapshotServesMax running
// transfers and those within snapshotRetainAfter of their end. A pin
// beyond it is not taken (that transfer's fetcher may need another).
const snapPinsMax = 4 * snapshotServesMax

// snapPins are the slots whose log above them compaction keeps, each until
// a deadline. Safe for concurrent use.
type snapPins struct {
	mu   sync.Mutex
	next uint64
	pins map[uint64]snapPin
}

type snapPin struct {
	slot  paxos.Slot
	until time.Time
}

// hold pins slot for snapshotStallTimeout from now (extend keeps it
// longer) and returns the pin's id (0: none taken).
func (p *snapPins) hold(slot paxos.Slot, now time.Time) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pins == nil {
		p.pins = map[uint64]snapPin{}
	}
	p.dropExpired(now)
	if len(p.pins) >= snapPinsMax {
		return 0
	}
	p.next++
	p.pins[p.next] = snapPin{slot: slot, until: now.Add(snapshotStallTimeout)}
	return p.next
}

// extend moves pin id's deadline to until (0 or an expired pin: nothing).
func (p *snapPins) extend(id uint64, until time.Time) {
	if id == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if pin, ok := p.pins[id]; ok {
		pin.until = until
		p.pins[id] = pin
	}
}

// floor is the lowest slot pinned at now, dropping expired pins.
func (p *snapPins) floor(now time.Time) (paxos.Slot, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropExpired(now)
	var low paxos.Slot
	for _, pin := range p.pins {
		if low == 0 || pin.slot < low {
			low = pin.slot
		}
	}
	return low, low != 0
}

func (p *snapPins) dropExpired(now time.Time) {
	for id, pin := range p.pins {
		if !now.Before(pin.until) {
			delete(p.pins, id)
		}
	}
}
