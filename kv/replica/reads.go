package replica

import (
	"container/heap"
	"sync"

	"synod/paxos"
)

// readWaiter is one ReadBarrier call.
type readWaiter struct {
	ch chan error // cap 1; receives exactly one value
	// Stage clock stamps (stages.go): queued by ReadBarrier, indexed when
	// its read index was known, released when the apply loop reached
	// index. Written before the value is sent on ch, read after it.
	queued, indexed, released int64
	index                     paxos.Slot
}

// readBatch is the reads that share one ReadIndex request. Owned by the
// consensus loop until its ReadState arrives.
type readBatch struct {
	waiters []*readWaiter
	tick    uint64 // consensus tick when requested
}

// indexedBatch waits for the apply loop to reach index.
type indexedBatch struct {
	index   paxos.Slot
	waiters []*readWaiter
}

type batchHeap []indexedBatch

func (h batchHeap) Len() int           { return len(h) }
func (h batchHeap) Less(i, j int) bool { return h[i].index < h[j].index }
func (h batchHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *batchHeap) Push(x any)        { *h = append(*h, x.(indexedBatch)) }
func (h *batchHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// readTracker holds reads from ReadIndex to the moment the apply loop
// reaches their index.
//
// Invariant: a waiter is in at most one of byID and waiting, and receives
// exactly one value on its channel.
type readTracker struct {
	byID    map[uint64]*readBatch // consensus loop only
	nextID  uint64                // consensus loop only
	pending int                   // waiters in byID; consensus loop only

	mu      sync.Mutex
	waiting batchHeap
	queued  int // waiters in waiting

	now func() int64 // the stage clock
}

func (t *readTracker) init(now func() int64) {
	t.byID = make(map[uint64]*readBatch)
	t.now = now
}

// release answers every waiting batch whose index is <= applied.
func (t *readTracker) release(applied paxos.Slot) {
	t.mu.Lock()
	var done []indexedBatch
	for len(t.waiting) > 0 && t.waiting[0].index <= applied {
		b := heap.Pop(&t.waiting).(indexedBatch)
		t.queued -= len(b.waiters)
		done = append(done, b)
	}
	t.mu.Unlock()
	if len(done) == 0 {
		return
	}
	now := t.now()
	for _, b := range done {
		for _, w := range b.waiters {
			w.released = now
			w.ch <- nil
		}
	}
}

// indexed moves a batch whose read index is known to the waiting heap, or
// answers it at once when applied already reached the index.
func (t *readTracker) indexed(index paxos.Slot, waiters []*readWaiter, applied func() paxos.Slot) {
	now := t.now()
	for _, w := range waiters {
		w.indexed, w.index = now, index
	}
	t.mu.Lock()
	if applied() >= index || TestingReadBeforeApplied {
		t.mu.Unlock()
		for _, w := range waiters {
			w.released = now
			w.ch <- nil
		}
		return
	}
	heap.Push(&t.waiting, indexedBatch{index: index, waiters: waiters})
	t.queued += len(waiters)
	t.mu.Unlock()
}

// failPending answers every batch still waiting for its read index with err
// (consensus loop only).
func (t *readTracker) failPending(err error) {
	for id, b := range t.byID {
		for _, w := range b.waiters {
			w.ch <- err
		}
		delete(t.byID, id)
	}
	t.pending = 0
}

// expire fails batches requested before tick minTick (consensus loop only).
func (t *readTracker) expire(minTick uint64, err error) {
	for id, b := range t.byID {
		if b.tick < minTick {
			for _, w := range b.waiters {
				w.ch <- err
			}
			t.pending -= len(b.waiters)
			delete(t.byID, id)
		}
	}
}

// failAll answers every read, pending or waiting (after the loops stopped).
func (t *readTracker) failAll(err error) {
	t.failPending(err)
	t.mu.Lock()
	w := t.waiting
	t.waiting = nil
	t.queued = 0
	t.mu.Unlock()
	for _, b := range w {
		for _, x := range b.waiters {
			x.ch <- err
		}
	}
}
