package sm

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"

	"synod/kv/proto"
	"synod/tenants"
)

// Read slots: a bound on the memory reads pin inside Pebble.
//
// A read holds the block its value sits in until it has copied the value
// (Get's closer, an iterator's current block), and a block holds a whole
// value: with megabyte values every read in progress pins a megabyte of
// Pebble's manual memory, outside what the block cache's size bounds once
// the cache is full. Reads had no bound but the server's request limits:
// 1,024 readers of megabyte values on a node with a 192 MiB budget held
// 426 table iterators at once, and the node's resident set reached
// 346 MiB (anonymous memory 310 MiB, the Go heap 62 MiB of it).
//
// So client reads take slots before they touch Pebble and give them back
// once they have copied what they read: a GET (and the quota check's
// ValueLen) one slot, which pins at most ReadSlotPinBytes (one block
// holding the largest value); a SCAN ScanReadSlots, because its iterator
// positions a block in each level of the LSM it reads (L0's sublevels and
// the levels below) and so may pin several. The slots are Options.ReadSlots
// (kvnode reserves ReadSlots*ReadSlotPinBytes of its memory budget for
// them: cmd/kvnode config_memory.go), so reads pin at most that much
// beyond the cache (a SCAN positioned in more than ScanReadSlots levels of
// megabyte values aside). Slots are granted to the tenants in turn and in
// arrival order within each (readSlots, below), a SCAN's all at once (no
// two SCANs can each hold part of what the other needs).
//
// A read waits for its slots at most until its context ends (the request's
// deadline: kv/server ends it request_timeout, 5 s by default, after the
// frame arrived; the wire carries no client deadline): then it is answered
// UNAVAILABLE without touching Pebble, so requests past their time do not
// hold the queue. The apply loop's
// own reads (CAS, sizes), snapshot streams and staging take no slot: the
// apply loop must never wait behind client reads. The quota check's
// ValueLen waits without a deadline (it is on the leader's write path,
// after the write was admitted, and its read is one block).

const (
	// ReadSlotsMax bounds the read slots whatever the memory: more reads
	// in Pebble at once than this gain nothing on the cores a node runs
	// on (measured on 2; a machine with many more cores may want more).
	ReadSlotsMax = 64
	// ReadSlotsMin is the least: small stores still read in parallel,
	// and a SCAN's ScanReadSlots always fit.
	ReadSlotsMin = 4
	// ScanReadSlots is what a SCAN takes (at most every slot there is).
	ScanReadSlots = 4
	// ReadSlotPinBytes is what one slot may pin: a data block holding the
	// largest value with its key, beside what fills a block before it
	// (Pebble's target block size, 4 KiB by default, rounded up to 64 KiB
	// with the block's restart points and trailer).
	ReadSlotPinBytes = proto.ValueBytesMax + proto.KeyBytesMax + 64<<10
	// readSlotsCacheDivisor: with no ReadSlots given, the slots pin at
	// most 1/readSlotsCacheDivisor of the cache.
	readSlotsCacheDivisor = 2
)

// errReadSlotWait is a read whose context ended while it waited for a
// read slot; it wraps the context's error.
var errReadSlotWait = errors.New("sm: the request's deadline passed while it waited for a read slot (the node is saturated with reads)")

// readSlotsFor is the number of read slots when Options.ReadSlots is 0:
// half a block cache of cacheBytes (0: Pebble's default cache, taken as
// 8 MiB) in ReadSlotPinBytes, within ReadSlotsMin..ReadSlotsMax.
func readSlotsFor(cacheBytes int64) int {
	if cacheBytes <= 0 {
		cacheBytes = 8 << 20
	}
	return clampReadSlots(cacheBytes / readSlotsCacheDivisor / ReadSlotPinBytes)
}

// ReadSlotsFor is the number of read slots that pin at most pinBytes,
// within ReadSlotsMin..ReadSlotsMax: what kvnode's memory plan gives the
// state machine (Options.ReadSlots) for the bytes it reserves.
func ReadSlotsFor(pinBytes int64) int { return clampReadSlots(pinBytes / ReadSlotPinBytes) }

func clampReadSlots(n int64) int { return int(max(ReadSlotsMin, min(ReadSlotsMax, n))) }

// readSlots is the weighted semaphore of reads inside Pebble, fair
// between tenants: waiters queue per tenant, in arrival order within
// each, and a slot given back goes to the tenants with waiters in turn
// (round robin), not to the longest queue's front. With one queue for
// all, six tenants re-sending unread megabyte GETs kept hundreds of reads
// ahead of every other tenant's, and an outside tester's one-at-a-time
// reader waited 1.3 s at the median and 2.7-6 s at the 99th percentile,
// some past their deadline. A read of w slots is granted once w are free
// when its tenant's turn comes; the turn does not pass it by (no read
// starves behind smaller ones), so a SCAN waits at most for the slots
// then held. Queues are bounded by the reads in flight, which the
// server bounds.
//
// Contract (TestReadSlotsFairBetweenTenants): a tenant's read queued
// behind any number of another tenant's is granted among the first two
// slots given back.
type readSlots struct {
	n int64 // the slots there are; read-only

	mu     sync.Mutex
	free   int64                     // slots not held
	queues map[tenants.ID]*list.List // each tenant's waiters, *slotWaiter, in arrival order
	ring   []tenants.ID              // the tenants with waiters, in turn order
	next   int                       // ring index of the tenant whose turn it is
}

// slotWaiter is one read waiting for w slots; ready is closed when they
// are its.
type slotWaiter struct {
	w     int64
	ready chan struct{}
}

func newReadSlots(n int) *readSlots {
	return &readSlots{n: int64(n), free: int64(n), queues: map[tenants.ID]*list.List{}}
}

// weight is what a read of w slots takes: every slot at most.
func (r *readSlots) weight(w int64) int64 { return min(w, r.n) }

// take waits for w slots for tenant until ctx ends (errReadSlotWait).
func (r *readSlots) take(ctx context.Context, tenant tenants.ID, w int64) error {
	w = r.weight(w)
	r.mu.Lock()
	if len(r.ring) == 0 && r.free >= w {
		r.free -= w
		r.mu.Unlock()
		return nil
	}
	sw := &slotWaiter{w: w, ready: make(chan struct{})}
	if testingReadSlotsFIFO {
		tenant = 0 // the planted bug: one queue for every tenant
	}
	q := r.queues[tenant]
	if q == nil {
		q = list.New()
		r.queues[tenant] = q
		r.ring = append(r.ring, tenant)
	}
	el := q.PushBack(sw)
	r.mu.Unlock()
	select {
	case <-sw.ready:
		return nil
	case <-ctx.Done():
	}
	r.mu.Lock()
	select {
	case <-sw.ready:
		// Granted as the context ended: give the slots back.
		r.free += w
	default:
		r.remove(tenant, q, el)
	}
	// Either way others may fit now (a removed front held the turn).
	r.grant()
	r.mu.Unlock()
	return fmt.Errorf("%w: %w", errReadSlotWait, ctx.Err())
}

// give returns w slots.
func (r *readSlots) give(w int64) {
	r.mu.Lock()
	r.free += r.weight(w)
	if r.free > r.n {
		r.mu.Unlock()
		panic("sm: more read slots given back than taken")
	}
	r.grant()
	r.mu.Unlock()
}

// grant hands free slots to the waiters, a tenant at a time in turn,
// until the front waiter of the tenant whose turn it is needs more than
// are free (r.mu held).
func (r *readSlots) grant() {
	for len(r.ring) > 0 {
		if r.next >= len(r.ring) {
			r.next = 0
		}
		tenant := r.ring[r.next]
		q := r.queues[tenant]
		sw := q.Front().Value.(*slotWaiter)
		if sw.w > r.free {
			return
		}
		r.free -= sw.w
		close(sw.ready)
		if r.remove(tenant, q, q.Front()) {
			continue // r.next is already the following tenant
		}
		r.next++
	}
}

// remove takes el out of tenant's queue q, and the tenant out of the
// turn order when q is left empty (reporting that it did) (r.mu held).
func (r *readSlots) remove(tenant tenants.ID, q *list.List, el *list.Element) (emptied bool) {
	q.Remove(el)
	if q.Len() > 0 {
		return false
	}
	delete(r.queues, tenant)
	for i, t := range r.ring {
		if t == tenant {
			r.ring = append(r.ring[:i], r.ring[i+1:]...)
			if i < r.next {
				r.next--
			}
			break
		}
	}
	return true
}

// testingReadSlotsFIFO plants one queue for all tenants (the old order).
var testingReadSlotsFIFO bool

// freeSlots is how many slots no read holds (tests).
func (r *readSlots) freeSlots() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.free
}
