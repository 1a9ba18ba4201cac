package server

import (
	"sync/atomic"
	"time"

	"synod/kv/proto"
)

// Refused connections are paced. A THROTTLED answer tells the client to
// wait its retry-after; a client that pipelines on regardless has every
// request refused again, as fast as the node can refuse them, and each
// refusal still costs the node a frame read, a goroutine and an answer
// written. Six tenants pipelining GETs of megabyte values whose answers
// they never read (an outside tester's flood) had a leader refuse about
// 15,000 GETs a second once a refusal stopped reading the store
// (kv/sm value_lens.go); its consensus loop, behind those goroutines for
// the two cores, lost leadership in two runs of four.
//
// So a connection whose last refusedRunPacedMin answers were all
// THROTTLED has its next frame read no sooner than the last refusal's
// retry-after (at most refusedPaceMax) after that refusal was sent, nor
// than a retry-after after the frame read before it: one request per
// retry-after, which is what the answers asked for. Two answers in a row
// that are not THROTTLED (refusedRunEndAnswers) end the run, and the
// connection is read at full speed again. (Ended by one answer, a run
// let a flooder of a rate-limited tenant, whose bucket admitted one
// request per retry-after, be refused 64 times at full speed after each
// admitted one: about 6,500 answers a second on one connection, against
// the 100 a second its retry-afters asked for.) A client that waits its
// retry-after before it sends is never slowed here (the time has passed
// when its frame comes); frames the reader had read ahead before the run
// reached the threshold (up to proto.InflightPerConnMax) still run at
// once.
//
// The pace is carried over to the tenant's next connections: while one
// of a tenant's connections is in a paced run, and for
// tenantPaceCarryOver after its last refusal there, a connection the
// tenant opens starts paced at that refusal's retry-after (its first frame
// waits one), instead of being refused refusedRunPacedMin times at full
// speed first. Otherwise a flooder that reconnects whenever it is paced
// would never be.

const (
	// refusedRunPacedMin is how many THROTTLED answers in a row, with no
	// other answer between, make a connection paced. A client of one
	// request at a time that honours retry-after never gets near it; a
	// pipelining one refused in a burst is paced at the retry-afters it
	// was given, until two answers in a row that are not THROTTLED.
	// Each flooding connection is refused this many times at full speed
	// before it is paced, so it is kept well below the pipeline's depth:
	// at 512, eighteen connections starting at once were refused 9,216
	// times in a burst, and a leader lost its leadership in one run of
	// four at the flood's start.
	refusedRunPacedMin = proto.InflightPerConnMax / 4
	// RefusedRunPacedMin is refusedRunPacedMin, for hosted protocols'
	// tests and docs.
	RefusedRunPacedMin = refusedRunPacedMin
	// refusedRunEndAnswers is how many answers in a row that are not
	// THROTTLED end a paced connection's run. One is not enough: a
	// tenant's rate bucket admits a request now and then, and a flooder
	// must not get a fresh run of full-speed refusals from each.
	refusedRunEndAnswers = 2
	// refusedPaceMax bounds the wait before a paced connection's next
	// frame, whatever retry-after the last refusal carried.
	refusedPaceMax = 100 * time.Millisecond
	// tenantPaceCarryOver is how long after a refusal in a paced run the
	// tenant's new connections start paced. Longer than a reconnection
	// takes; short enough that a tenant that stopped flooding is not
	// slowed for long (its first two answered requests end a run anyway).
	tenantPaceCarryOver = time.Second
)

// tenantPace is a tenant's pace mark: until when a connection it opens
// starts paced, and at what retry-after. One per registered tenant, fixed
// at New. Safe for concurrent use.
type tenantPace struct {
	until, after atomic.Int64 // ns since paceEpoch; ns
}

// mark notes a refusal with retry-after ra in a paced run at now (time
// since paceEpoch).
func (p *tenantPace) mark(ra, now time.Duration) {
	if testingNoTenantPace {
		return
	}
	p.after.Store(int64(ra))
	p.until.Store(int64(now + tenantPaceCarryOver))
}

// testingNoTenantPace plants the gap the tenant's mark closes: a new
// connection starts unpaced whatever its tenant's others did.
var testingNoTenantPace bool

// refusals tracks a connection's run of THROTTLED answers.
type refusals struct {
	// run counts THROTTLED answers since the last other answer, or,
	// once it reached refusedRunPacedMin, since the run began; answers
	// counts the answers in a row that were not THROTTLED since the run
	// reached it (refusedRunEndAnswers of them end it).
	run, answers atomic.Int64
	// after is the last THROTTLED answer's retry-after, at most
	// refusedPaceMax, in ns; until is when it ends, as time since
	// paceEpoch in ns.
	after, until atomic.Int64
	// read is when the reader last read a frame in a run (reader only).
	read time.Duration
	// tenant is the connection's tenant's mark (nil before HELLO).
	tenant *tenantPace
}

// inherit gives a connection just authenticated its tenant's mark (any
// goroutine, before the connection's first request is read) and starts
// it paced when the mark is fresh: its run at the threshold, its first
// frame a retry-after away. It reports whether it did.
func (r *refusals) inherit(p *tenantPace) bool {
	r.tenant = p
	if p == nil {
		return false
	}
	now := time.Since(paceEpoch)
	if time.Duration(p.until.Load()) <= now {
		return false
	}
	ra := time.Duration(p.after.Load())
	r.after.Store(int64(ra))
	r.until.Store(int64(now + ra))
	r.run.Store(refusedRunPacedMin)
	return true
}

// paceEpoch is where refusals' times count from (monotonic).
var paceEpoch = time.Now()

// answered notes an answer sent, THROTTLED with retry-after ra or not.
func (r *refusals) answered(throttled bool, ra time.Duration) {
	if throttled {
		ra = min(max(ra, RetryAfterMin), refusedPaceMax)
		now := time.Since(paceEpoch)
		r.after.Store(int64(ra))
		r.until.Store(int64(now + ra))
		if r.run.Add(1) >= refusedRunPacedMin && r.tenant != nil {
			r.tenant.mark(ra, now)
		}
		if r.answers.Load() != 0 {
			r.answers.Store(0)
		}
		return
	}
	if n := r.run.Load(); n < refusedRunPacedMin {
		if n != 0 {
			r.run.Store(0)
		}
		return
	}
	// Paced: the connection stays paced until refusedRunEndAnswers
	// answers in a row were not THROTTLED.
	if r.answers.Add(1) >= refusedRunEndAnswers {
		r.run.Store(0)
		r.answers.Store(0)
	}
}

// pace is how long the next frame waits, when the connection is in a run
// of refusedRunPacedMin refusals or more: until the last refusal's
// retry-after has passed, and a retry-after since the last frame read in
// the run (so frames already sent do not all go at once while their
// predecessors' answers are still being written); else 0. A client that
// waits its retry-after before it sends is not slowed: the time has
// passed when its frame comes.
func (r *refusals) pace() time.Duration {
	if r.run.Load() < refusedRunPacedMin {
		return 0
	}
	now := time.Since(paceEpoch)
	next := max(time.Duration(r.until.Load()), r.read+time.Duration(r.after.Load()))
	return max(0, next-now)
}

// waitPace waits out the connection's pace (pace) before its next frame
// is read, counting the frame paced when it waits; false when the
// connection ended meanwhile. Reader only.
func (c *conn) waitPace() bool {
	d := c.refused.pace()
	if c.refused.run.Load() >= refusedRunPacedMin {
		defer func() { c.refused.read = time.Since(paceEpoch) }()
	}
	if d == 0 {
		return true
	}
	c.s.paced.Add(1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.ctx.Done():
		return false
	}
}
