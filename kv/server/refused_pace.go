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
// of a tenant's connections is in a paced run, or the tenant's own run
// (refusedRunPacedMin THROTTLED answers on any of its connections with
// no other answer between) has reached it, and for tenantPaceCarryOver
// after the last such refusal, a connection the tenant opens starts paced
// at that refusal's retry-after (its first frame waits one), instead of
// being refused refusedRunPacedMin times at full speed first. Otherwise a
// flooder that reconnects before its connection is paced would never be
// (an outside tester closing after 63 GETs: 122-133k answers a second).
// And a tenant's paced connections share their turns: their frames sent
// early (before their own pace allowed) are read one per retry-after for
// all of them (tenantPace.reserve), or a flooder would multiply its rate
// by the connections it opens (up to ConnsPerTenantMax, 256 by default).
// A frame sent in its time, as by a client that waits its retry-after,
// and a new connection's first frame take no turn: they wait for no other
// connection (with every paced frame taking turns, an outside tester's
// client that waited its retry-afters, opened beside 200 flooding
// connections, waited up to 1 s a frame and 10 s for one request).

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
	// run counts the tenant's THROTTLED answers, on any of its
	// connections, since its last answer that was not THROTTLED; at
	// refusedRunPacedMin it marks the tenant, though no connection of it
	// reached a run of its own (one that closes after 63 and reconnects).
	run atomic.Int64
	// next is the tenant's next turn for a paced frame (ns since
	// paceEpoch): every paced frame of the tenant, on any connection,
	// is read a retry-after after the one before. A reader holds at
	// most one turn, taken when its frame has come, so next stays
	// within ConnsPerTenantMax x refusedPaceMax of now (256 x 100 ms by
	// default): that bounds the wait of any paced frame.
	next atomic.Int64
}

// turn is when a paced frame ready at at could be read: at, or the
// tenant's next turn if later (nil: at).
func (p *tenantPace) turn(at time.Duration) time.Duration {
	if p == nil || testingOwnTurns {
		return at
	}
	return max(at, time.Duration(p.next.Load()))
}

// reserve takes the turn of a paced frame ready at at, which holds the
// next one of the tenant's paced frames until after later, and returns
// when the frame may be read. One connection alone is hardly slowed by
// it: its own pace already spaces its frames a retry-after apart (its
// frame waits out the previous frame's retry-after when the next one is
// shorter). Any goroutine.
func (p *tenantPace) reserve(at, after time.Duration) time.Duration {
	if p == nil || testingOwnTurns {
		return at
	}
	for {
		next := p.next.Load()
		turn := max(at, time.Duration(next))
		if p.next.CompareAndSwap(next, int64(turn+after)) {
			return turn
		}
	}
}

// mark notes a refusal with retry-after ra in a paced run at now (time
// since paceEpoch).
func (p *tenantPace) mark(ra, now time.Duration) {
	if p == nil || testingNoTenantMark {
		return
	}
	p.after.Store(int64(ra))
	p.until.Store(int64(now + tenantPaceCarryOver))
}

// marked reports whether the mark is fresh at now: a refusal in one of
// the tenant's paced runs within tenantPaceCarryOver.
func (p *tenantPace) marked(now time.Duration) bool {
	return p != nil && time.Duration(p.until.Load()) > now
}

// testingNoTenantMark plants the gap the tenant's mark closes: a new
// connection starts unpaced whatever its tenant's others did.
var testingNoTenantMark bool

// testingNoTenantRun plants the gap the tenant's run closes: only a
// connection's own run of refusedRunPacedMin marks its tenant.
var testingNoTenantRun bool

// testingTurnsForAll plants the gap that sparing frames sent in their
// time closes: every paced frame, and a new connection's first, takes its
// tenant's turn, so a client that waits its retry-after waits behind a
// flooder's connections too.
var testingTurnsForAll bool

// testingOwnTurns plants the gap the tenant's turns close: each paced
// connection is read one frame per retry-after of its own.
var testingOwnTurns bool

// testingPaceIgnoresHangup plants the gap waitPace's hang-up check closes:
// a paced reader sleeps out its wait whether or not its peer closed. An
// atomic: readers of a running server read it.
var testingPaceIgnoresHangup atomic.Bool

// refusals tracks a connection's run of THROTTLED answers.
type refusals struct {
	// run counts THROTTLED answers since the last other answer, or,
	// once the connection is paced, since the run began; answers counts
	// the answers in a row that were not THROTTLED since it was paced
	// (refusedRunEndAnswers of them end the run).
	run, answers atomic.Int64
	// paced: the run reached refusedRunPacedMin, or the connection
	// inherited its tenant's mark, and the run has not ended.
	paced atomic.Bool
	// after is the last THROTTLED answer's retry-after, at most
	// refusedPaceMax, in ns; until is when it ends, as time since
	// paceEpoch in ns.
	after, until atomic.Int64
	// read is when the reader last read a frame in a run (waitPace's
	// goroutine only).
	read time.Duration
	// fresh: paced from HELLO (inherit), its first frame not yet read
	// (set before the first request is read; then waitPace's goroutine
	// only).
	fresh bool
	// tenant is the connection's tenant's mark (nil before HELLO).
	tenant *tenantPace
}

// inherit gives a connection just authenticated its tenant's mark (any
// goroutine, before the connection's first request is read) and starts
// it paced when the mark is fresh: its first frame a retry-after away.
// It reports whether it did.
func (r *refusals) inherit(p *tenantPace) bool {
	r.tenant = p
	now := time.Since(paceEpoch)
	if !p.marked(now) {
		return false
	}
	ra := time.Duration(p.after.Load())
	r.after.Store(int64(ra))
	r.until.Store(int64(now + ra))
	r.paced.Store(true)
	r.fresh = true
	return true
}

// endsRefusedRun reports whether an answer that is not THROTTLED counts
// toward ending a run of refusals: a data request's that the node served.
// HELLO's, PING's and refusals of the client's own errors (BAD_REQUEST,
// TOO_LARGE, UNAUTHORIZED) do not: a flooder could slip them between its
// refused requests for free (a reconnecting one ended its tenant's run at
// every HELLO).
func endsRefusedRun(resp *proto.Response) bool {
	switch resp.Op {
	case proto.OpHello, proto.OpPing:
		return false
	}
	switch resp.Status {
	case proto.StatusBadRequest, proto.StatusTooLarge, proto.StatusUnauthorized:
		return false
	}
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
		n := r.run.Add(1)
		if r.answers.Load() != 0 {
			r.answers.Store(0)
		}
		tenantRun := false
		if t := r.tenant; t != nil && !testingNoTenantRun {
			tenantRun = t.run.Add(1) >= refusedRunPacedMin
		}
		paced := r.paced.Load()
		if !paced && n >= refusedRunPacedMin {
			paced = true
			r.paced.Store(true)
		}
		if paced || tenantRun {
			r.tenant.mark(ra, now)
		}
		return
	}
	if t := r.tenant; t != nil && t.run.Load() != 0 {
		t.run.Store(0)
	}
	if !r.paced.Load() {
		if r.run.Load() != 0 {
			r.run.Store(0)
		}
		return
	}
	// Paced: the connection stays paced until refusedRunEndAnswers
	// answers in a row were not THROTTLED.
	if r.answers.Add(1) >= refusedRunEndAnswers {
		r.paced.Store(false)
		r.run.Store(0)
		r.answers.Store(0)
	}
}

// pace is how long the next frame waits, when the connection is paced:
// until the last refusal's retry-after has passed, and a retry-after
// since the last frame read in the run (so frames already sent do not
// all go at once while their predecessors' answers are still being
// written), and, for a frame that came before that (early), until its
// tenant's next turn (tenantPace.reserve: the early frames of its paced
// connections together are read one per retry-after); else 0. A client
// that waits its retry-after before it sends is not slowed: the time has
// passed when its frame comes, and it takes no turn. Called by the
// goroutine that calls waitPace (it reads fresh).
func (r *refusals) pace() time.Duration {
	if !r.paced.Load() {
		return 0
	}
	now := time.Since(paceEpoch)
	at := r.ready()
	if r.takesTurn(at, now, false) {
		at = r.tenant.turn(at)
	}
	return max(0, at-now)
}

// takesTurn reports whether a frame its own pace lets be read at at, now,
// takes its tenant's turn: only an early one (sent before its own pace
// allowed), and not a new connection's first. A frame that came in its
// time, as a client waiting its retry-after sends it, waits for no other
// connection. Nor does one that came once every earlier frame of its
// connection was answered (answeredAll: the binary reader knows it, a
// hosted protocol tells it, Hosted.WaitPace) and the last refusal's retry-after had
// passed: its client sent it after an answer that asked no wait, an
// admitted one (a compliant client paced from HELLO waited up to 1 s a
// frame behind its tenant's flooding connections). A pipelined frame
// asked about before its predecessor is answered (the request runs in a
// goroutine of its own) still takes a turn, so a flooder skips the turns
// at most once per admitted request. waitPace's goroutine only (it reads
// fresh).
func (r *refusals) takesTurn(at, now time.Duration, answeredAll bool) bool {
	if at <= now || (r.fresh && !testingTurnsForAll) {
		return false
	}
	if answeredAll && time.Duration(r.until.Load()) <= now && !testingTurnsAfterAdmitted {
		return false
	}
	return true
}

// testingTurnsAfterAdmitted plants the gap that sparing frames sent after
// an admitted answer closes: every early frame takes a turn.
var testingTurnsAfterAdmitted bool

// ready is when the connection's own pace lets its next frame be read,
// in a run (time since paceEpoch).
func (r *refusals) ready() time.Duration {
	return max(time.Duration(r.until.Load()), r.read+time.Duration(r.after.Load()))
}

// waitPace waits out the connection's pace (pace) before its next frame
// is read, taking its tenant's turn when the frame came early, and counts
// the frame paced when it waits; false when the connection ended
// meanwhile. Reader only (for a hosted protocol, the goroutine that runs
// its commands).
func (c *conn) waitPace(answeredAll bool) bool {
	r := &c.refused
	if !r.paced.Load() {
		return true
	}
	defer func() { r.read = time.Since(paceEpoch) }()
	now := time.Since(paceEpoch)
	at := r.ready()
	if r.takesTurn(at, now, answeredAll) {
		at = r.tenant.reserve(at, time.Duration(r.after.Load()))
	}
	r.fresh = false
	d := at - now
	if d <= 0 {
		return true
	}
	c.s.paced.Add(1)
	// The reader reads nothing while it waits, so it would not see the
	// peer close: a flooder's closed connections held their tenant's
	// connection cap for as long as their turns were ahead (1.5 s seen
	// with a few connections sharing turns). So the wait looks for the
	// peer's hang-up every paceHangupCheck, and ends the connection at
	// it: a peer that half-closed to read its answers loses those of its
	// frames still paced (they were not run), which a client honouring
	// retry-after never has.
	end := time.Now().Add(d)
	for {
		step := min(time.Until(end), paceHangupCheck)
		if step <= 0 {
			return true
		}
		t := time.NewTimer(step)
		select {
		case <-t.C:
		case <-c.ctx.Done():
			t.Stop()
			return false
		}
		if !testingPaceIgnoresHangup.Load() && peerHungUp(c.nc) {
			c.close("the peer hung up while its frames were paced")
			return false
		}
	}
}

// paceHangupCheck is how often a paced reader's wait looks for its peer's
// hang-up (waitPace).
const paceHangupCheck = 20 * time.Millisecond
