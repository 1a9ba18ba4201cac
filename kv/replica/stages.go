package replica

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"synod/internal/stall"
	"synod/paxos"
)

// Stages of a request's path on this node, as Metrics.Stage (writes) and
// Metrics.ReadStage (reads) time them. Each is one observation per event
// named in its comment; "per slot" stages are timed for each slot (a slot
// carries up to paxos.SlotCmdsMax writes), so a stalled slot counts once
// however many writes wait in it.
//
// A write proposed on this node (the leader):
//
//	admission      the server read the frame's header -> Backend.Do began
//	               (admission hook, decode, the request's goroutine); per write
//	propose_queue  the write was queued for the proposer (the tenant
//	               scheduler, or the FIFO without one) -> the consensus
//	               loop handed it to paxos; per write
//	ready          handed to paxos -> the Ready carrying its slot's
//	               acceptance was taken (waiting in paxos's proposal queue
//	               for the pipeline window, and for the Readys before it);
//	               per slot, timed by the slot's first write
//	persist        one persist barrier of the acceptor log: a Ready's
//	               accepted entries on the consensus loop (every node: on
//	               followers this is the acceptor's half of the round
//	               trip), or a batch of the leader's own acceptances on
//	               the persister goroutine (persister.go); per barrier
//	accept_rtt     the leader's Accepts handed to the send loop -> the
//	               Ready in which the slot is committed was taken (the
//	               network, the followers' persist, the inbound queue and
//	               the consensus loop's own backlog; the leader's own
//	               persist runs in parallel, persister.go, so a slow one
//	               shows here too); per slot
//	commit         that Ready taken -> its committed entries offered to the
//	               apply loop (that Ready's own persist and send come
//	               first); per Ready (every node)
//	apply_queue    offered to the apply loop -> the slot's apply began
//	               (room in the bounded apply queue, the slots before it,
//	               snapshots taken on the apply loop); per slot (every node)
//	apply          one slot applied to the state machine; per slot (every node)
//	reply          the apply loop answered the write -> its goroutine
//	               resumed with the result; per write
//
// A linearizable read on the leader:
//
//	admission      as for writes
//	read_index     ReadBarrier queued -> its read index known (a lease
//	               read answers at the next Ready, otherwise a quorum round)
//	apply_wait     read index known -> the apply loop reached it
//	state_machine  the read of the state machine itself (Pebble)
//
// A stage that takes longer than the stall detector's threshold
// (Config.Stalls) is a stall: counted in Metrics.Stalls by path and stage,
// logged with the slot (0 where the stage knows none) and kept with a
// trace (internal/stall).
const (
	stageAdmission    = "admission"
	stageProposeQueue = "propose_queue"
	stageReady        = "ready"
	// stagePersist and stageApply: metrics.go.
	stageAcceptRTT    = "accept_rtt"
	stageCommit       = "commit"
	stageApplyQueue   = "apply_queue"
	stageReply        = "reply"
	stageReadIndex    = "read_index"
	stageApplyWait    = "apply_wait"
	stageStateMachine = "state_machine"

	pathWrite = "write"
	pathRead  = "read"
)

// writeStage and readStage index the stage tables.
type writeStage uint8

const (
	wsAdmission writeStage = iota
	wsProposeQueue
	wsReady
	wsPersist
	wsAcceptRTT
	wsCommit
	wsApplyQueue
	wsApply
	wsReply
	writeStagesN
)

// WriteStages are the stage labels of synod_write_stage_seconds, in path
// order.
var WriteStages = [writeStagesN]string{stageAdmission, stageProposeQueue, stageReady, stagePersist,
	stageAcceptRTT, stageCommit, stageApplyQueue, stageApply, stageReply}

type readStage uint8

const (
	rsAdmission readStage = iota
	rsReadIndex
	rsApplyWait
	rsStateMachine
	readStagesN
)

// ReadStages are the stage labels of synod_read_stage_seconds, in path
// order.
var ReadStages = [readStagesN]string{stageAdmission, stageReadIndex, stageApplyWait, stageStateMachine}

// stageSeries are the children of the stage histograms and stall
// counters, looked up once (label lookups are not free on the hot path).
type stageSeries struct {
	write       [writeStagesN]prometheus.Observer
	read        [readStagesN]prometheus.Observer
	writeStalls [writeStagesN]prometheus.Counter
	readStalls  [readStagesN]prometheus.Counter
}

// initStages creates every child series, so that each exists (at zero)
// from the start: a rate over a series born at its first stall shows none.
func (m *Metrics) initStages() {
	s := &m.stages
	for i, name := range WriteStages {
		s.write[i] = m.Stage.WithLabelValues(name)
		s.writeStalls[i] = m.Stalls.WithLabelValues(pathWrite, name)
	}
	for i, name := range ReadStages {
		s.read[i] = m.ReadStage.WithLabelValues(name)
		s.readStalls[i] = m.Stalls.WithLabelValues(pathRead, name)
	}
	m.persistSeconds = s.write[wsPersist]
	m.applySeconds = s.write[wsApply]
}

// writeStageTook records that stage st of the write path took d (slot:
// the slot concerned, 0 if the stage knows none).
func (r *Replica) writeStageTook(st writeStage, d time.Duration, slot paxos.Slot) {
	r.metrics.stages.write[st].Observe(d.Seconds())
	if r.stallAfter > 0 && d > r.stallAfter {
		r.metrics.stages.writeStalls[st].Inc()
		r.cfg.Stalls.Stalled(stall.Event{Path: pathWrite, Stage: WriteStages[st], Took: d, Slot: uint64(slot)})
	}
}

// readStageTook is writeStageTook for the read path.
func (r *Replica) readStageTook(st readStage, d time.Duration, slot paxos.Slot) {
	r.metrics.stages.read[st].Observe(d.Seconds())
	if r.stallAfter > 0 && d > r.stallAfter {
		r.metrics.stages.readStalls[st].Inc()
		r.cfg.Stalls.Stalled(stall.Event{Path: pathRead, Stage: ReadStages[st], Took: d, Slot: uint64(slot)})
	}
}

// stageNow is the stage clock: nanoseconds since the replica's epoch on
// Config.Now (the simulated clock in the simulator). 0 means "not
// stamped", so a reading is never 0.
func (r *Replica) stageNow() int64 {
	return max(int64(r.cfg.Now().Sub(r.clk.epoch)), 1)
}

// since is the time from stamp t to now (0 for an unstamped t).
func (r *Replica) since(t, now int64) time.Duration {
	if t == 0 || now < t {
		return 0
	}
	return time.Duration(now - t)
}

// Sizes of the timeline's rings.
const (
	// proposalTimesMax: when each of this node's proposals was handed to
	// paxos, by proposal number; it must cover the commands paxos may
	// hold queued (paxos.ProposalQueueMax) plus those in flight in the
	// pipeline window's slots. An overwritten entry only loses one
	// "ready" observation.
	proposalTimesMax = 1 << 15
	// slotTimesMax: the leader's slots between their Ready and their
	// commit; it must cover paxos's pipeline window (1024 slots).
	slotTimesMax = 1 << 12
)

// Compile-time check: the proposal ring covers paxos's proposal queue
// twice over.
var _ = [proposalTimesMax - 2*paxos.ProposalQueueMax]struct{}{}

// timeline holds the stamps that let the consensus loop time the ready,
// accept_rtt and commit stages of the slots this node proposes. The
// consensus loop is its only user; its memory is fixed (two rings).
type timeline struct {
	props [proposalTimesMax]propStamp
	slots [slotTimesMax]slotStamp
	// fresh are the slots of the current Ready that this node proposed,
	// stamped when the Ready was taken and again when sent.
	fresh []paxos.Slot
	// readyAt is when the current Ready was taken.
	readyAt int64
	// lastFresh is the highest slot stamped so far: a slot accepted again
	// (a new leader re-proposing, a retried Ready) keeps its first stamps.
	lastFresh paxos.Slot
}

type propStamp struct {
	seq uint64
	at  int64 // handed to paxos
}

type slotStamp struct {
	slot paxos.Slot // 0: empty
	sent int64      // its Accepts handed to the send loop (0: not yet)
}

// proposed stamps the proposals of ids as handed to paxos at now
// (consensus loop).
func (t *timeline) proposed(ids []uint64, now int64) {
	for _, id := range ids {
		t.props[id%proposalTimesMax] = propStamp{seq: id, at: now}
	}
}

// dequeued gives back the bytes a proposal held in the propose queue and
// times its propose_queue stage (consensus loop).
func (r *Replica) dequeued(p *proposal, now int64) {
	r.queuedBytes.Add(-int64(len(p.env))) // reserveQueued
	if p.queued != 0 {
		r.writeStageTook(wsProposeQueue, r.since(p.queued, now), 0)
	}
}

// readyTaken stamps a Ready just taken: each accepted entry that this
// node proposed in this life, above every slot stamped before, times its
// ready stage (consensus loop). A leader's own acceptances come in
// rd.OwnAccepted (persisted in parallel with the send: persister.go); an
// entry in rd.Accepted is this node's own only when it stopped leading
// before handing it out, so both are walked, Accepted first (Ready order).
func (r *Replica) readyTaken(rd *paxos.Ready) {
	t := &r.timeline
	now := r.stageNow()
	t.readyAt, t.fresh = now, t.fresh[:0]
	r.stampFresh(rd.Accepted, now)
	r.stampFresh(rd.OwnAccepted, now)
}

// stampFresh is readyTaken for one list of accepted entries.
func (r *Replica) stampFresh(es []paxos.Entry, now int64) {
	t := &r.timeline
	for i := range es {
		e := &es[i]
		if e.Slot <= t.lastFresh || e.Type != paxos.EntryNormal || len(e.Cmds) == 0 {
			continue
		}
		id, _, err := parseEnvelope(e.Cmds[0])
		if err != nil || id.origin != r.cfg.ID || id.boot != r.boot {
			continue
		}
		t.lastFresh = e.Slot
		t.slots[e.Slot%slotTimesMax] = slotStamp{slot: e.Slot}
		t.fresh = append(t.fresh, e.Slot)
		if p := t.props[id.seq%proposalTimesMax]; p.seq == id.seq {
			r.writeStageTook(wsReady, r.since(p.at, now), e.Slot)
		}
	}
}

// readySent stamps the current Ready's fresh slots as sent (consensus
// loop, after its messages went to the send loop).
func (r *Replica) readySent() {
	t := &r.timeline
	if len(t.fresh) == 0 {
		return
	}
	now := r.stageNow()
	for _, s := range t.fresh {
		if st := &t.slots[s%slotTimesMax]; st.slot == s {
			st.sent = now
		}
	}
	t.fresh = t.fresh[:0]
}

// readyCommitted times the committed entries of the current Ready, which
// were offered to the apply loop at queued: accept_rtt for each slot this
// node proposed and sent, commit once for the Ready (consensus loop).
func (r *Replica) readyCommitted(committed []paxos.Entry, queued int64) {
	t := &r.timeline
	for i := range committed {
		s := committed[i].Slot
		st := &t.slots[s%slotTimesMax]
		if st.slot != s || st.sent == 0 {
			continue
		}
		r.writeStageTook(wsAcceptRTT, r.since(st.sent, t.readyAt), s)
		*st = slotStamp{}
	}
	if n := len(committed); n > 0 {
		r.writeStageTook(wsCommit, r.since(t.readyAt, queued), committed[n-1].Slot)
	}
}

// readStagesTook times a released read's read_index and apply_wait stages
// (the reader's goroutine, after the release).
func (r *Replica) readStagesTook(w *readWaiter) {
	if w.indexed == 0 {
		return
	}
	r.readStageTook(rsReadIndex, r.since(w.queued, w.indexed), w.index)
	r.readStageTook(rsApplyWait, r.since(w.indexed, w.released), w.index)
}
