package replica

import (
	"sync/atomic"

	"synod/paxos"
)

// Nothing slow on the heartbeat path: the consensus loop never waits for
// the apply loop while it has room here. Committed entries (and snapshot
// installs) go to the bounded apply queue when it has room, and otherwise
// wait in order in the backlog, which the consensus loop's select drains
// as the apply loop makes room; meanwhile the loop keeps ticking, sending
// heartbeats and renewing leases, so a long apply (a Pebble stall, a
// snapshot) does not cost the leader its followers. The backlog is
// bounded: past applyBacklogThrottleItems the leader refuses new writes
// (THROTTLED), and only past applyBacklogItemsMax, which refused writes
// leave for the commits already in flight (and a follower, which refuses
// nothing, for its leader's), does the loop wait for the apply queue as it
// always did.
const (
	// applyBacklogItemsMax bounds the committed batches waiting for room
	// in the apply queue (each one Ready's committed entries).
	applyBacklogItemsMax = 4096
	// applyBacklogThrottleItems: with this many batches waiting, new
	// writes are refused with ErrBusy until the apply loop catches up.
	applyBacklogThrottleItems = applyBacklogItemsMax / 2
)

// applyBacklog is what the apply queue had no room for (consensus loop
// only, except backlogged, which writers read).
type applyBacklog struct {
	items []backlogItem
	// backlogged is set while len(items) >= applyBacklogThrottleItems.
	backlogged atomic.Bool
}

// backlogItem is one apply-queue item and the slot it brings the apply
// loop through.
type backlogItem struct {
	it      applyItem
	through paxos.Slot
}

// toApply hands it, which brings the apply loop through slot through, to
// the apply loop: at once when the queue has room and nothing waits before
// it, otherwise in the backlog; only a full backlog waits. It returns false
// when the replica stopped meanwhile.
func (r *Replica) toApply(it applyItem, through paxos.Slot) bool {
	b := &r.applyBacklog
	if len(b.items) == 0 {
		select {
		case r.applyC <- it:
			r.handedToApply(through)
			return true
		default:
		}
	}
	if len(b.items) >= applyBacklogItemsMax {
		// Full: wait, in order, as the loop did before it had a backlog.
		for len(b.items) > 0 {
			select {
			case r.applyC <- b.items[0].it:
				r.popBacklog()
			case <-r.stop:
				return false
			}
		}
		select {
		case r.applyC <- it:
			r.handedToApply(through)
			return true
		case <-r.stop:
			return false
		}
	}
	b.items = append(b.items, backlogItem{it: it, through: through})
	if len(b.items) == applyBacklogThrottleItems {
		b.backlogged.Store(true)
		r.log.Warn().Int("batches", len(b.items)).Msg("the apply loop is behind: refusing new writes until it catches up")
	}
	return true
}

// handedToApply records that the apply queue holds everything through slot
// s: the accel early path may hand it what follows.
func (r *Replica) handedToApply(s paxos.Slot) {
	if r.accel != nil {
		r.accel.deliveredThrough(s)
	}
}

// applyBacklogHead is what the consensus loop's select offers the apply
// queue: the backlog's first item, or a nil channel when there is none.
func (r *Replica) applyBacklogHead() (chan<- applyItem, applyItem) {
	if len(r.applyBacklog.items) == 0 {
		return nil, applyItem{}
	}
	return r.applyC, r.applyBacklog.items[0].it
}

// applyHeadSent runs after the select handed the backlog's first item to
// the apply queue: it drops it and moves what else fits without waiting.
func (r *Replica) applyHeadSent() {
	r.popBacklog()
	b := &r.applyBacklog
	for len(b.items) > 0 {
		select {
		case r.applyC <- b.items[0].it:
			r.popBacklog()
		default:
			return
		}
	}
}

func (r *Replica) popBacklog() {
	b := &r.applyBacklog
	r.handedToApply(b.items[0].through)
	b.items[0] = backlogItem{}
	b.items = b.items[1:]
	if len(b.items) == 0 {
		b.items = nil // let the array go
	}
	if len(b.items) < applyBacklogThrottleItems && b.backlogged.Load() {
		b.backlogged.Store(false)
		r.log.Info().Msg("the apply loop caught up: taking writes again")
	}
}

// flushApplyBacklog hands the whole backlog to the apply loop, waiting
// (Close, after the consensus loop stopped, so that what was committed is
// applied before the apply queue closes).
func (r *Replica) flushApplyBacklog() {
	for len(r.applyBacklog.items) > 0 {
		r.applyC <- r.applyBacklog.items[0].it
		r.popBacklog()
	}
}
