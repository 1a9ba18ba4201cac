package replica

import (
	"sync/atomic"
	"unsafe"

	"synod/paxos"
)

// Nothing slow on the heartbeat path: the consensus loop does not wait for
// the apply loop while the backlog has room.
//
// Committed entries and snapshot installs go to the apply queue
// (applyQueueBatchesMax) when it has room and nothing waits before them,
// and otherwise wait here, in order; the consensus loop's select hands the
// backlog's head to the apply queue as soon as the apply loop makes room.
// Meanwhile the loop keeps ticking, stepping messages, sending heartbeats
// and renewing its lease, so a long apply (a Pebble write stall, a hung
// device for less than the stuck watch's stuckAfter) does not cost a
// leader its followers. Before the backlog, a leader whose apply stalled
// for 1.5 s under load stopped its heartbeats once 256 committed batches
// queued, and a follower was elected (TestSlowApplyKeepsLeader's planted
// run).
//
// Consecutive committed batches merge into one item of up to
// applyBacklogMergeEntriesMax entries: a follower gets a batch of a slot
// or two with every commit it hears of, and an e2e follower whose apply
// stalled 2 s filled 4,096 unmerged items
// (TestFollowerApplyStallKeepsItsLoop). A merged item keeps its first
// batch's stage stamp, so the apply_queue stage of the later ones counts
// from before they came.
//
// The backlog is bounded in items and in bytes (the commands', plus
// applyBacklogEntryBytes an entry and applyBacklogCmdBytes a command for
// what holds them). Past half of either bound a leader takes no new
// writes from its queues (holdProposals): they
// wait there, bounded, and answer THROTTLED past those bounds, so only
// the slots already in flight still commit into the backlog. A follower
// refuses nothing (its leader's writes commit with or without it); only
// when the backlog is full does its loop wait for the apply queue, as it
// always did, which costs its leader nothing (a follower that misses
// heartbeats while blocked is refused by the pre-check of the members that
// heard from the leader). Every item was copied out of paxos
// (copyEntries) and is still held by the acceptor log: nothing applied
// later than it can be truncated.
//
// Order: an item enters the apply queue only after every item before it,
// and the accel early path (accel_commit.go) hands the apply loop nothing
// while the backlog holds anything, so the apply loop still receives
// slots in order (and skips those it applied already).
const (
	// applyBacklogBatchesMax bounds the items (committed entries of one
	// or more Readys, or one install) waiting for room in the apply queue.
	applyBacklogBatchesMax = 4096
	// applyBacklogMergeEntriesMax bounds the entries of one merged item.
	applyBacklogMergeEntriesMax = 1024
	// applyBacklogBytesMax bounds their bytes (itemBytes).
	applyBacklogBytesMax = 64 << 20
	// applyBacklogEntryBytes and applyBacklogCmdBytes are what an entry
	// (a paxos.Entry: 72 bytes on 64-bit machines) and a command's slice
	// header (24) cost beside the command's bytes.
	applyBacklogEntryBytes = int64(unsafe.Sizeof(paxos.Entry{}))
	applyBacklogCmdBytes   = int64(unsafe.Sizeof([]byte(nil)))
	// applyBacklogHoldBatches and applyBacklogHoldBytes: at either, a
	// leader takes no new writes until the apply loop catches up.
	applyBacklogHoldBatches = applyBacklogBatchesMax / 2
	applyBacklogHoldBytes   = applyBacklogBytesMax / 2
)

// applyBacklog is what the apply queue had no room for (consensus loop
// only, except the atomics, which the accel early path and the tests
// read).
type applyBacklog struct {
	items []backlogItem
	bytes int64
	// holding is set while a leader takes no new writes because of the
	// backlog (applyBacklogHold*).
	holding bool
	// waiting is len(items), for the accel early path.
	waiting atomic.Int64
	// maxWaiting and maxBytes are the most items and bytes (itemBytes)
	// that ever waited: high-water marks for the tests.
	maxWaiting atomic.Int64
	maxBytes   atomic.Int64
}

// backlogItem is one apply-queue item, its command bytes and the slot it
// brings the apply loop through.
type backlogItem struct {
	it      applyItem
	bytes   int64
	through paxos.Slot
}

// itemBytes is what the backlog's byte bound counts for it: its
// commands' bytes and what holds them.
func itemBytes(it applyItem) int64 {
	n := int64(len(it.entries)) * applyBacklogEntryBytes
	for i := range it.entries {
		n += int64(len(it.entries[i].Cmds)) * applyBacklogCmdBytes
		for _, c := range it.entries[i].Cmds {
			n += int64(len(c))
		}
	}
	return n
}

// toApply hands it, which brings the apply loop through slot through, to
// the apply loop (consensus loop): at once when the apply queue has room
// and nothing waits before it, otherwise into the backlog; only a full
// backlog waits, in order, as the loop did before it had one. It returns
// false when the replica stopped meanwhile.
func (r *Replica) toApply(it applyItem, through paxos.Slot) bool {
	b := &r.applyBacklog
	if (len(b.items) == 0 || testingBacklogOvertaken) && !TestingApplyQueueBlocks {
		select {
		case r.applyC <- it:
			r.handedToApply(through)
			return true
		default:
		}
	}
	n := itemBytes(it)
	if TestingApplyQueueBlocks || len(b.items) >= applyBacklogBatchesMax || (len(b.items) > 0 && b.bytes+n > applyBacklogBytesMax) {
		if !r.waitApplyBacklog(r.stop) {
			return false
		}
		select {
		case r.applyC <- it:
			r.handedToApply(through)
			return true
		case <-r.stop:
			return false
		}
	}
	b.bytes += n
	if b.bytes > b.maxBytes.Load() {
		b.maxBytes.Store(b.bytes)
	}
	if last := len(b.items) - 1; last >= 0 && mergeable(b.items[last].it, it) {
		// The head is never in flight here: the loop's select sends a
		// copy taken before this input, and takes a new one after it.
		b.items[last].it.entries = append(b.items[last].it.entries, it.entries...)
		b.items[last].bytes += n
		b.items[last].through = through
		return true
	}
	b.items = append(b.items, backlogItem{it: it, bytes: n, through: through})
	r.backlogChanged()
	return true
}

// backlogChanged publishes the backlog's length (waiting, its high-water
// mark and the gauge) after an item joined or left it.
func (r *Replica) backlogChanged() {
	b := &r.applyBacklog
	n := int64(len(b.items))
	b.waiting.Store(n)
	if n > b.maxWaiting.Load() {
		b.maxWaiting.Store(n)
	}
	r.metrics.ApplyBacklog.Set(float64(n))
}

// mergeable says whether next's entries may join prev in one backlog
// item: both committed entries (an install stands alone), within
// applyBacklogMergeEntriesMax.
func mergeable(prev, next applyItem) bool {
	return prev.install == nil && next.install == nil && len(prev.entries)+len(next.entries) <= applyBacklogMergeEntriesMax
}

// handedToApply records that the apply queue holds everything through
// slot s: the accel early path may hand it what follows.
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
	r.drainApplyBacklog()
}

// drainApplyBacklog moves the backlog's items into the apply queue while
// it has room, without waiting (consensus loop; every input starts with
// it, so the simulator, which drives inputs one at a time, drains too).
func (r *Replica) drainApplyBacklog() {
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
	b.bytes -= b.items[0].bytes
	b.items[0] = backlogItem{}
	b.items = b.items[1:]
	if len(b.items) == 0 {
		b.items = nil // let the array go
		b.bytes = 0
	}
	r.backlogChanged()
}

// applyBacklogHolds reports whether the backlog is past its hold line
// (consensus loop, from holdProposals), and logs the crossings.
func (r *Replica) applyBacklogHolds() bool {
	b := &r.applyBacklog
	hold := len(b.items) >= applyBacklogHoldBatches || b.bytes >= applyBacklogHoldBytes
	if hold != b.holding {
		b.holding = hold
		if hold {
			r.metrics.ApplyBacklogHolds.Inc()
			r.log.Warn().Int("batches", len(b.items)).Int64("bytes", b.bytes).
				Msg("the apply loop is behind: this leader takes no new writes until it catches up")
		} else {
			r.log.Info().Msg("the apply loop caught up: taking writes again")
		}
	}
	return hold
}

// flushApplyBacklog hands the whole backlog to the apply loop, waiting
// (Close, after the consensus loop stopped, so that what was committed is
// applied before the apply queue closes). It gives up on the rest if the
// apply loop never ran (the simulator drives its steps itself) or ended
// (it could not pin its CPU).
func (r *Replica) flushApplyBacklog() {
	if r.applyExited != nil {
		r.waitApplyBacklog(r.applyExited)
	}
}

// waitApplyBacklog hands the whole backlog to the apply queue in order,
// waiting for room, until it is empty (true) or done is closed (false).
func (r *Replica) waitApplyBacklog(done <-chan struct{}) bool {
	for len(r.applyBacklog.items) > 0 {
		select {
		case r.applyC <- r.applyBacklog.items[0].it:
			r.popBacklog()
		case <-done:
			return false
		}
	}
	return true
}

// testingBacklogOvertaken, planted, lets a batch into the apply queue
// ahead of the backlog's whenever the queue has room
// (TestApplyBacklogOrderAndBounds sees the order broken). The simulator
// cannot meet it: its apply loop makes room only between consensus
// inputs, and every input drains the backlog first.
var testingBacklogOvertaken bool
