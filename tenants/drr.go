package tenants

import (
	"errors"
	"sync"
	"time"
)

// Bounds of the scheduler.
const (
	// TenantQueueItemsMax is the default bound on one tenant's queue.
	TenantQueueItemsMax = 256
	// drrRingItemsMin is the ring a tenant's queue starts with and goes
	// back to once empty: the ring grows by doubling to its bound only
	// while the tenant has that many writes waiting, so a bound in the
	// thousands costs memory only under a burst (a ring allocated whole
	// at its bound, for every tenant of a registry, would not).
	drrRingItemsMin = 16
	// TenantQueueBytesMax is the default bound on the frame bytes one
	// tenant's queue holds: items alone let 256 megabyte writes wait in
	// one tenant's queue, a quarter of a gigabyte of heap beside the
	// request budgets that were meant to bound them (an abandoned
	// request's write stays queued after its budget is given back).
	// An item larger than the bound is taken into an empty queue, so the
	// largest write always passes.
	TenantQueueBytesMax = 8 << 20
	// DRRQuantumBytesDefault is the default quantum: the credit a weight-1
	// tenant gains per round. It is kept near the cost of a few small
	// items because the worst wait of a compliant tenant is one round, the
	// sum of every backlogged tenant's quantum: a large quantum is a large
	// head-of-line delay.
	DRRQuantumBytesDefault = 1024
	// DRRItemOverheadBytes is added to every item's cost: proposing,
	// replicating and applying an operation costs about this much beyond
	// its bytes, so many tiny items are not free.
	DRRItemOverheadBytes = 256
	// DRRCostBytesMax caps the cost of one item so that a dequeue needs at
	// most DRRCostBytesMax/quantum rounds.
	DRRCostBytesMax = 1 << 20
	classCount      = int(ClassBulk) + 1
)

// ErrQueueFull is returned by Enqueue when the tenant's queue is at its
// bound; the server answers THROTTLED (with a short retry-after), never
// drops silently and never queues without bound.
var ErrQueueFull = errors.New("tenants: tenant queue full")

// DRRConfig configures a DRR; zero fields take the defaults.
type DRRConfig struct {
	QueueItemsMax int // per tenant
	// QueueItemsMaxByClass, where set (non-zero), bounds the queue of a
	// tenant of that class instead of QueueItemsMax (kv/replica sets it
	// to the overload guard's shedding points, so a tenant's burst is
	// shed where the guard says, not earlier by its queue).
	QueueItemsMaxByClass [classCount]int
	QueueBytesMax        int // per tenant, frame bytes
	QuantumBytes         int
}

// DRR is a deficit-round-robin scheduler across tenants, feeding the
// proposer's batcher. Classes are strict priority (ClassCritical before
// ClassStandard before ClassBulk); within a class each backlogged tenant
// gets QuantumBytes*Weight of credit per round, so a tenant within its
// contract waits at most about one round behind any number of tenants
// over theirs, however long their queues.
//
// Consensus traffic never enters a DRR: the runtime keeps it on its own
// path (receive loop -> paxos/accel), and the proposer drains the DRR only
// when it has room in its batch, so client work is always behind consensus
// messages and heartbeats.
//
// Safe for concurrent use (server goroutines enqueue, the proposer
// dequeues).
type DRR[T any] struct {
	mu      sync.Mutex
	cfg     DRRConfig
	now     func() time.Time
	metrics *Metrics
	queues  map[ID]*tenantQueue[T] // fixed at NewDRR
	// Per class, two round-robin lists, as in fq_codel: a queue that was
	// empty and gets an item joins fresh with one quantum of credit and is
	// served before the queues that stayed backlogged (stale). A tenant
	// sending within its contract is nearly always fresh, so it waits only
	// for the item in service, not for a round of everyone's quanta; a
	// backlogged tenant cannot stay fresh, since it must drain to rejoin.
	fresh, stale [classCount][]*tenantQueue[T]
	length       int
}

type drrItem[T any] struct {
	v     T
	frame int // frame bytes, as enqueued
	cost  int
	enq   time.Time
}

type tenantQueue[T any] struct {
	id       ID
	class    Class
	quantum  int
	itemsMax int          // the queue's bound (QueueItemsMax or its class's)
	items    []drrItem[T] // ring: drrRingItemsMin to itemsMax, grown by doubling
	head, n  int
	bytes    int // frame bytes of the items queued
	deficit  int
	active   bool
}

// NewDRR builds a queue per tenant in reg. now stamps enqueue times for
// the queueing-delay metric; metrics may be nil.
func NewDRR[T any](reg *Registry, cfg DRRConfig, now func() time.Time, metrics *Metrics) *DRR[T] {
	if cfg.QueueItemsMax <= 0 {
		cfg.QueueItemsMax = TenantQueueItemsMax
	}
	if cfg.QueueBytesMax <= 0 {
		cfg.QueueBytesMax = TenantQueueBytesMax
	}
	if cfg.QuantumBytes <= 0 {
		cfg.QuantumBytes = DRRQuantumBytesDefault
	}
	d := &DRR[T]{cfg: cfg, now: now, metrics: metrics, queues: map[ID]*tenantQueue[T]{}}
	for _, sp := range reg.All() {
		w := max(sp.Weight, 1)
		itemsMax := cfg.QueueItemsMax
		if c := int(sp.Priority); c >= 0 && c < classCount && cfg.QueueItemsMaxByClass[c] > 0 {
			itemsMax = cfg.QueueItemsMaxByClass[c]
		}
		d.queues[sp.ID] = &tenantQueue[T]{id: sp.ID, class: sp.Priority, quantum: cfg.QuantumBytes * w,
			itemsMax: itemsMax, items: make([]drrItem[T], min(itemsMax, drrRingItemsMin))}
	}
	return d
}

// Enqueue appends v, a frame of frameBytes, to tenant id's queue; its cost
// is frameBytes + DRRItemOverheadBytes. It returns ErrUnknownTenant, or
// ErrQueueFull when the queue holds QueueItemsMax items or frameBytes would
// take it past QueueBytesMax (an empty queue takes any one item).
func (d *DRR[T]) Enqueue(id ID, frameBytes int, v T) error {
	frameBytes = max(frameBytes, 0)
	cost := frameBytes + DRRItemOverheadBytes
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.queues[id]
	if q == nil {
		return ErrUnknownTenant
	}
	if q.n == q.itemsMax || (q.n > 0 && q.bytes+frameBytes > d.cfg.QueueBytesMax) {
		d.metrics.Throttled(id, ThrottleQueue)
		return ErrQueueFull
	}
	if q.n == len(q.items) {
		q.resize(min(2*len(q.items), q.itemsMax))
	}
	q.items[(q.head+q.n)%len(q.items)] = drrItem[T]{v: v, frame: frameBytes, cost: min(cost, DRRCostBytesMax), enq: d.now()}
	q.n++
	q.bytes += frameBytes
	d.length++
	if !q.active {
		q.active = true
		q.deficit = q.quantum
		d.fresh[q.class] = append(d.fresh[q.class], q)
	}
	return nil
}

// Dequeue removes the next item by class priority and deficit round robin.
// ok is false when every queue is empty.
func (d *DRR[T]) Dequeue() (v T, id ID, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for c := range d.fresh {
		for len(d.fresh[c]) > 0 || len(d.stale[c]) > 0 {
			list := &d.fresh[c]
			if len(*list) == 0 {
				list = &d.stale[c]
			}
			q := (*list)[0]
			it := &q.items[q.head]
			if q.deficit < it.cost {
				// Out of credit: one more quantum, to the back of the stale list.
				q.deficit += q.quantum
				*list = (*list)[1:]
				d.stale[c] = append(d.stale[c], q)
				continue
			}
			q.deficit -= it.cost
			v, id = it.v, q.id
			d.metrics.ObserveQueue(id, d.now().Sub(it.enq))
			q.bytes -= it.frame
			*it = drrItem[T]{} // do not pin the value
			q.head = (q.head + 1) % len(q.items)
			q.n--
			d.length--
			if q.n == 0 {
				q.active = false
				q.deficit = 0
				*list = (*list)[1:]
				if len(q.items) > drrRingItemsMin {
					q.resize(drrRingItemsMin) // the burst is over: give its ring back
				}
			}
			return v, id, true
		}
	}
	return v, 0, false
}

// resize moves the queue's items, in order, into a ring of size items
// (at least q.n).
func (q *tenantQueue[T]) resize(size int) {
	ring := make([]drrItem[T], size)
	for i := 0; i < q.n; i++ {
		ring[i] = q.items[(q.head+i)%len(q.items)]
	}
	q.items, q.head = ring, 0
}

// Len returns the number of queued items.
func (d *DRR[T]) Len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.length
}
