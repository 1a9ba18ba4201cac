package replica

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"synod/paxos"
)

// The leader's own writes, off the consensus loop.
//
// A leader's own acceptances (paxos Ready.OwnAccepted) need not be durable
// before its Accepts leave, only before its vote counts (paxos ownvote.go).
// So the consensus loop appends them to the acceptor log in Ready order,
// like every other acceptance (the log is the order, so a later acceptance
// of a slot always supersedes an earlier one on recovery), and hands the
// persist barrier to the persister goroutine: the Accepts go out at once,
// the leader's msync runs while the followers run theirs, and the consensus
// loop keeps ticking, sending heartbeats and renewing leases however long
// the msync takes. When the barrier returns, the persister arms the accel
// plane's aggregator for those slots (accel_own.go) and wakes the consensus
// loop, which reports the writes to paxos (OwnAcceptedDurable) and only
// then counts the leader's vote.
//
// On shm and dax logs, whose barrier is a fence rather than an msync, the
// consensus loop persists its own writes itself and reports them on its
// next turn, the same way (ownPersistInline).
//
// Everything else stays synchronous: a promise, and a follower's (or a
// demoted leader's) acceptances, are persisted on the consensus loop before
// the Ready's messages are sent; such a persist also makes every own write
// appended before it durable, and reports it. pmem's Persist does not hold
// the log while its barrier runs, so the consensus loop's appends never
// wait behind the persister's msync.

// ownRangesMax bounds the runs of own acceptances waiting for the
// persister, and those persisted and waiting for the consensus loop. A run
// is one leadership's contiguous slots, and consecutive Readys extend it,
// so more than one or two means leadership changed repeatedly within one
// persist; past the bound the consensus loop persists itself.
const ownRangesMax = 64

// ownRange is a run of the leader's own acceptances: slots first..last
// under ballot b.
type ownRange struct {
	b           paxos.Ballot
	first, last paxos.Slot
}

// ownWrites is the persister's state, shared by the consensus loop (queue,
// takeDone) and the persister (take, finish).
type ownWrites struct {
	mu     sync.Mutex
	queued []ownRange // appended to the log, no Persist covering them begun
	done   []ownRange // durable, not yet reported to paxos
	// kick wakes the persister, doneC the consensus loop (both cap 1:
	// a pending wake-up covers everything queued since).
	kick  chan struct{}
	doneC chan struct{}
	// handed counts the runs queued for the persister (tests).
	handed atomic.Uint64
}

func (o *ownWrites) init() {
	o.kick = make(chan struct{}, 1)
	o.doneC = make(chan struct{}, 1)
}

// addRange appends rg to rs, extending the last run when rg continues it.
func addRange(rs []ownRange, rg ownRange) []ownRange {
	if n := len(rs); n > 0 && rs[n-1].b == rg.b && rs[n-1].last+1 == rg.first {
		rs[n-1].last = rg.last
		return rs
	}
	return append(rs, rg)
}

// queue hands rg (appended to the log) to the persister. It returns false,
// queueing nothing, when the queue is full.
func (o *ownWrites) queue(rg ownRange) bool {
	o.mu.Lock()
	q := addRange(o.queued, rg) // extends in place, or appends past len(o.queued)
	ok := len(q) <= ownRangesMax
	if ok {
		o.queued = q
	}
	o.mu.Unlock()
	if ok {
		o.handed.Add(1)
		wake(o.kick)
	}
	return ok
}

// queueAll queues rgs in order until the queue is full, and returns
// those it did not queue.
func (o *ownWrites) queueAll(rgs []ownRange) (unqueued []ownRange) {
	for len(rgs) > 0 && o.queue(rgs[0]) {
		rgs = rgs[1:]
	}
	return rgs
}

// coveredBySync records that a Persist the consensus loop made covered
// every queued run and rgs: they are durable. It returns them.
func (o *ownWrites) coveredBySync(rgs ...ownRange) []ownRange {
	o.mu.Lock()
	covered := o.queued
	o.queued = nil
	for _, rg := range rgs {
		covered = addRange(covered, rg)
	}
	for _, c := range covered {
		o.done = addRange(o.done, c)
	}
	o.mu.Unlock()
	if len(covered) > 0 {
		wake(o.doneC)
	}
	return covered
}

// take hands the persister everything queued.
func (o *ownWrites) take() []ownRange {
	o.mu.Lock()
	defer o.mu.Unlock()
	b := o.queued
	o.queued = nil
	return b
}

// finish records that batch is durable and wakes the consensus loop.
func (o *ownWrites) finish(batch []ownRange) {
	o.mu.Lock()
	for _, rg := range batch {
		o.done = addRange(o.done, rg)
	}
	o.mu.Unlock()
	wake(o.doneC)
}

// takeDone hands the consensus loop every durable run not yet reported.
func (o *ownWrites) takeDone() []ownRange {
	o.mu.Lock()
	defer o.mu.Unlock()
	d := o.done
	o.done = nil
	return d
}

// pending reports whether runs wait for the persister.
func (o *ownWrites) pending() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.queued) > 0
}

func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// persistReady is step 1 of the Ready contract (consensus loop): the
// promise and the acceptances answered in this Ready durable before any of
// its messages leave; the leader's own acceptances appended and left to
// the persister. It returns false, having done nothing durable after the
// failed step, when the acceptor log is full (the caller retries the same
// Ready later) or failed (the replica stops).
func (r *Replica) persistReady(rd *paxos.Ready) bool {
	if rd.Promised != nil {
		if err := r.alog.SetPromised(*rd.Promised); err != nil {
			r.die(fmt.Errorf("persisting the promised ballot: %w", err))
			return false
		}
		if r.accel != nil {
			r.accel.promisedDurable(*rd.Promised)
		}
	}
	accepted := rd.Accepted
	if r.accel != nil && len(accepted) > 0 {
		accepted = r.accel.fast.notPersisted(accepted) // the fast path persisted these
	}
	own := rd.OwnAccepted
	// An answered acceptance supersedes a waiting own entry of its slot
	// (own_backlog.go).
	r.ownBacklog.supersede(rd.Accepted)
	if len(accepted)+len(own) > 0 {
		start := r.cfg.Now()
		used0, _ := r.alog.Usage()
		var err error
		if len(accepted) > 0 {
			err = r.alog.Append(accepted)
		}
		var (
			ranges  []ownRange
			ownLast paxos.Slot
		)
		if err == nil {
			// After the answered ones: in Ready order. What does not fit
			// waits in the backlog; the Ready goes on (own_backlog.go).
			ranges, ownLast, err = r.appendOwn(own)
		}
		if err == nil {
			used1, capacity := r.alog.Usage()
			r.logTail.appended(used1-used0, max(ownLast, lastSlot(accepted, nil)), capacity)
		}
		sync := len(accepted) > 0
		inline := false // the leader's own writes, persisted here (ownPersistInline)
		unqueued := ranges
		if err == nil && !sync {
			if inline = r.ownPersistInline(); !inline {
				unqueued = r.own.queueAll(ranges)
				sync = len(unqueued) > 0 // the persister's queue is full
			}
		}
		if err == nil && (sync || inline) {
			if !inline {
				r.persistDelay()
			}
			err = r.alog.Persist()
			r.writeStageTook(wsPersist, r.cfg.Now().Sub(start), lastSlot(accepted, own))
		}
		if errors.Is(err, ErrLogFull) {
			if !r.logFull.Load() {
				r.log.Warn().Msg("acceptor log full: refusing writes until a snapshot lets it truncate")
			}
			r.logFull.Store(true)
			r.metrics.LogFull.Inc()
			r.requestSnapshot()
			return false
		}
		if err != nil {
			r.die(fmt.Errorf("persisting accepted entries: %w", err))
			return false
		}
		if sync || inline {
			// That Persist covered every own write appended before it.
			if covered := r.own.coveredBySync(unqueued...); r.accel != nil && len(covered) > 0 {
				r.accel.ownDurable(covered)
			}
		}
	}
	if len(rd.Accepted) > 0 {
		// What superseded waiting own entries is durable now (persisted
		// above, or by the accel fast path).
		r.releaseSuperseded()
	}
	if len(rd.Accepted)+len(own) > 0 {
		r.checkLogUsage()
	}
	if r.logFull.Load() {
		r.logFull.Store(false)
		r.log.Info().Msg("acceptor log has room again")
	}
	return true
}

func lastSlot(a, b []paxos.Entry) paxos.Slot {
	if len(b) > 0 {
		return b[len(b)-1].Slot
	}
	if len(a) > 0 {
		return a[len(a)-1].Slot
	}
	return 0
}

// ownPersistInline reports whether the consensus loop persists the
// leader's own writes itself instead of handing them to the persister:
// when the acceptor log's persist is a store fence or cache-line flushes
// (shm and dax modes), not a system call that may block. Handing over cost
// two goroutine wake-ups a Ready (the persister's, then the consensus
// loop's on doneC) for a barrier of well under a microsecond: on a leader
// at a tenth of its ceiling, about 15 % of all its wake-ups
// (docs/benchmarking.md, "Fewer wake-ups a write"). The vote still counts
// only once the persist returned: coveredBySync reports the writes done,
// and the loop hands them to paxos on its next turn (doneC), as it does
// for a persister's. Not while an injected persist delay waits
// (faults_delay.go): that delay stands for a slow device, which must not
// stall the consensus loop; the next Ready takes it on the persister.
// Never in the simulator, which drives the persister as a step of its own.
func (r *Replica) ownPersistInline() bool {
	return r.ownInline && r.faults.PersistDelayPending() == 0
}

// testingOwnPersistAsync, planted, sends the own writes of every mode to
// the persister (the old way).
var testingOwnPersistAsync bool

// persistLoop runs the persister: one Persist for everything queued since
// the last one.
func (r *Replica) persistLoop() {
	defer r.loopsWG.Done()
	for {
		select {
		case <-r.stop:
			return
		case <-r.own.kick:
		}
		r.persistOwn()
	}
}

// persistOwn persists the leader's own writes queued so far and hands them
// back (persister; the simulator calls it as one step). It reports whether
// there was anything to persist.
func (r *Replica) persistOwn() bool {
	batch := r.own.take()
	if len(batch) == 0 {
		return false
	}
	start := r.cfg.Now()
	r.persistDelay()
	err := r.alog.Persist()
	r.writeStageTook(wsPersist, r.cfg.Now().Sub(start), batch[len(batch)-1].last)
	if err != nil {
		r.die(fmt.Errorf("persisting the leader's own entries: %w", err))
		return true
	}
	if r.accel != nil {
		r.accel.ownDurable(batch) // the plane counts the leader's vote from now on
	}
	r.own.finish(batch)
	return true
}

// reportOwn tells paxos which of the leader's own writes are durable
// (consensus loop, on the persister's wake-up).
func (r *Replica) reportOwn() {
	for _, rg := range r.own.takeDone() {
		r.node.OwnAcceptedDurable(rg.b, rg.first, rg.last)
		r.watch.ownReports++ // progress of the own vote (stuck.go)
	}
}

// persistDelay serves a fault-injected slow persist (Faults.DelayNextPersist)
// before the barrier of the next persist, whichever path makes it. The
// simulator has its own model of slow persists and ignores it.
func (r *Replica) persistDelay() {
	if d := r.faults.takePersistDelay(); d > 0 && !r.cfg.simulated {
		r.log.Warn().Dur("delay", d).Msg("fault injection: delaying this persist")
		time.Sleep(d)
	}
}

// allAccepted is every entry rd hands over for the acceptor log, in Ready
// order: the answered acceptances, then the leader's own.
func allAccepted(rd *paxos.Ready) []paxos.Entry {
	switch {
	case len(rd.OwnAccepted) == 0:
		return rd.Accepted
	case len(rd.Accepted) == 0:
		return rd.OwnAccepted
	}
	return append(append(make([]paxos.Entry, 0, len(rd.Accepted)+len(rd.OwnAccepted)), rd.Accepted...), rd.OwnAccepted...)
}
