package replica

import (
	"math"
	"sync/atomic"
	"time"
)

// loopClock is the consensus loop's clock: how many ticks of the monotonic
// clock have passed since the loop started, and how many of them the paxos
// node has been given.
//
// The contract (every lease decision rests on it): before the consensus
// loop hands the node any input (Step, ReadIndex, Propose, a control
// function such as Campaign or NoteLeaderContact) it delivers every tick
// owed up to a clock reading taken after that input was received, in both
// the normal and the stalled branch of the loop. So the node never decides
// with a clock older than the input it is deciding on:
//
//   - a leader checks its lease (ReadIndex) at a time no earlier than the
//     read's arrival, so a leader resumed after a SIGSTOP, a GC pause or a
//     starved loop sees its lease as expired instead of serving a read
//     from before the pause;
//   - an acceptor starts the lease it grants with a heartbeat ack no
//     earlier than the moment it actually stepped the heartbeat, so its
//     refusal window never ends before the leader's lease (the leader dates
//     its lease from the heartbeat's send tick, which is earlier).
//
// Ticks are whole periods: a reading is rounded down, so a node's clock
// lags real time by less than one tick, which paxos's DriftTicks covers
// (see paxos/doc.go). The monotonic clock (CLOCK_MONOTONIC) keeps running
// while the process is stopped, so a SIGSTOP shows up as owed ticks.
type loopClock struct {
	epoch     time.Time // set in New, with the node; read-only after
	now       func() time.Time
	period    time.Duration
	delivered uint64 // ticks given to the node (consensus loop only); <= ticks due
	// lastGapTicks and lastGapAt describe the latest delivery of more than
	// gapLoggedTicksMin owed ticks at once (a loop that did not run for
	// that long): how many, and the tick it ended at. Consensus loop only;
	// the role-change log reports them (consensus.go).
	lastGapTicks, lastGapAt uint64
	// alive is when (ns since epoch) the consensus loop last began an
	// iteration; other goroutines read it to tell a wedged loop.
	alive atomic.Int64
}

func (c *loopClock) init(period time.Duration, now func() time.Time) {
	c.epoch, c.period, c.now = now(), period, now
}

// since is how long ago the epoch was.
func (c *loopClock) since() time.Duration { return c.now().Sub(c.epoch) }

// markAlive records that the consensus loop began an iteration.
func (c *loopClock) markAlive() { c.alive.Store(int64(c.since())) }

// sinceAlive is how long ago the consensus loop last began an iteration.
func (c *loopClock) sinceAlive() time.Duration {
	return c.since() - time.Duration(c.alive.Load())
}

// due is the number of whole tick periods since the epoch.
func (c *loopClock) due() uint64 { return uint64(c.since() / c.period) }

// syncClock delivers to the node every tick owed up to now and returns the
// current tick (consensus loop only). Call it after receiving an input and
// before handing the input to the node.
func (r *Replica) syncClock() uint64 {
	if TestingStaleClock {
		// The planted bug: inputs are handed to the node with the clock
		// of the last ticker event, however long ago that was.
		return r.clk.delivered
	}
	return r.deliverTicks()
}

// deliverTicks gives the node every tick owed up to now and returns the
// current tick (consensus loop only; the ticker case calls it directly).
//
// Owed ticks go in one Elapse: the clock (and every lease) moves by all of
// them, the heartbeat timer fires at most once, and the liveness timers
// (election, check quorum) count only a few of them (paxos Elapse), so a
// loop that stalled steps the answers waiting in its queue before it
// judges its peers silent.
func (r *Replica) deliverTicks() uint64 {
	due := r.clk.due()
	if due > r.clk.delivered {
		owed := due - r.clk.delivered
		if owed >= gapLoggedTicksMin {
			r.clk.lastGapTicks, r.clk.lastGapAt = owed, due
		}
		r.node.Elapse(int(min(owed, math.MaxInt32)))
		r.clk.delivered = due
	}
	return due
}

// gapLoggedTicksMin is the shortest loop gap (ticks owed at once) the
// role-change log reports as the node's latest stall.
const gapLoggedTicksMin = 10
