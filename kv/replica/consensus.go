package replica

import (
	"errors"
	"fmt"
	"time"

	"synod/internal/lograte"
	"synod/paxos"
)

// consensusLoop owns r.node: nothing else touches it.
//
// Every input is handed to the node only after syncClock delivered the
// ticks owed up to a clock reading taken after the input was received
// (clock.go): the node's lease decisions always use a current clock. The
// loop itself only selects; consensusInput does the work, so that the
// deterministic simulator can drive the same code one input at a time.
func (r *Replica) consensusLoop() {
	defer r.loopsWG.Done()
	if err := pinCPU(r.cfg.Cores.Consensus); err != nil {
		r.reportFatal(err)
		return
	}
	ticker := time.NewTicker(time.Duration(loopWakeTicks(r.cfg.HeartbeatTicks)) * r.cfg.Tick)
	defer ticker.Stop()
	mirrorC := r.mirrors()
	for {
		var in consensusInput
		applyHeadC, applyHead := r.applyBacklogHead()
		if r.stalled != nil {
			// Only ticks (to retry) and control (compaction frees room)
			// are served while a Ready waits for log space.
			select {
			case <-r.stop:
				return
			case <-ticker.C:
				in.kind = inTick
				r.tickWakes.Add(1)
			case in.fn = <-r.controlC:
				in.kind = inControl
			case <-r.own.doneC:
				in.kind = inOwnDurable
			case applyHeadC <- applyHead: // nil while the backlog is empty
				r.applyHeadSent()
				continue
			}
		} else {
			proposeC, drrKick := r.proposeC, r.drrGate()
			if r.holdProposals() {
				proposeC, drrKick = nil, nil
			}
			select {
			case <-r.stop:
				return
			case <-ticker.C:
				in.kind = inTick
				r.tickWakes.Add(1)
			case in.msg = <-r.inbound:
				in.kind = inInbound
			case in.prop = <-proposeC:
				in.kind = inPropose
			case <-drrKick: // nil without a scheduler or with the gate closed
				in.kind = inDRR
			case <-r.gateC: // nil without a scheduler
				in.kind = inGate
			case in.msg = <-mirrorC: // accepts the accel fast path already answered
				in.kind = inMirror
			case in.read = <-r.readC:
				in.kind = inRead
			case in.fn = <-r.controlC:
				in.kind = inControl
			case <-r.own.doneC: // the persister finished (persister.go)
				in.kind = inOwnDurable
			case applyHeadC <- applyHead: // the apply loop made room (apply_backlog.go)
				r.applyHeadSent()
				continue
			}
		}
		r.consensusInput(in)
	}
}

// loopWakeTicks is how many ticks apart the ticker wakes the consensus
// loop: a quarter of the heartbeat period, at least one. Every other input
// wakes the loop at once, and each input first delivers every tick owed
// (syncClock, clock.go), so the ticker only has to wake the loop for the
// timers: the heartbeat (it fires on time to the tick, its period being a
// multiple of the wake period at the default 20 ticks), the election and
// check-quorum countdowns (late by less than the wake period), leases
// (decided on the clock read with each input, never on the ticker). A
// wake-up every tick was 85 % of an idle node's goroutine wake-ups, about
// 1,000 a second a node (docs/benchmarking.md, "Fewer wake-ups a
// write"). Liveness timers count up to half a heartbeat of one delivery
// (paxos LivenessTicksPerElapseMax), more than a quarter: the routine
// deliveries count in full.
func loopWakeTicks(heartbeatTicks int) int {
	if testingWakeEveryTick {
		return 1
	}
	return max(1, heartbeatTicks/4)
}

// testingWakeEveryTick, planted, wakes the consensus loop every tick (the
// old way).
var testingWakeEveryTick bool

// holdProposals reports whether the consensus loop should leave the
// writes queued for it where they are (consensus loop): on a leader whose
// acceptor log is past the line admission keeps (accept_admission.go),
// until a snapshot lets it truncate. A full log would stall this loop
// (persistReady) and with it the heartbeats; writes instead queue in
// proposeC or the tenant scheduler, whose bounds answer THROTTLED past
// them. A node that does not lead takes them at once, to refuse them.
// Nor does a leader take writes while its own acceptances wait for room
// (own_backlog.go): new ones would only queue behind them, and its paxos
// log would hold their values in memory meanwhile. Nor while its apply
// loop is so far behind that committed batches pile up in the apply
// backlog (apply_backlog.go): the writes already in flight still commit
// into it, and new ones wait until the apply loop catches up.
func (r *Replica) holdProposals() bool {
	if s := r.status.Load(); s == nil || s.Role != paxos.RoleLeader {
		return false
	}
	if len(r.ownBacklog.entries) > 0 {
		r.snapshotForRoom()
		return true
	}
	used, capacity := r.alog.Usage()
	if capacity > 0 && used >= admitBytesMax(capacity) {
		r.snapshotForRoom()
		return true
	}
	return r.applyBacklogHolds()
}

// inputKind names what the consensus loop received.
type inputKind uint8

const (
	inTick inputKind = iota + 1
	inInbound
	inPropose
	inDRR
	inMirror
	inRead
	inControl
	inOwnDurable
	inGate // the pipeline gate may open: only look again (pipeline_gate.go)
)

// consensusInput is one input the consensus loop received: a tick, the
// first of a run of inbound messages, proposals or reads (the handler
// drains the rest of the run from the same queue), a mirror, or a control
// function.
type consensusInput struct {
	kind inputKind
	msg  paxos.Message
	prop proposal
	read *readWaiter
	fn   func()
}

// loopState is the consensus loop's own bookkeeping (consensus loop only).
type loopState struct {
	started    bool
	tick       uint64 // the current tick at the last ticker event
	stalledAt  uint64
	lastLeader paxos.NodeID
	lastRole   paxos.Role
	batch      [][]byte
	batchIDs   []uint64
	// deferred is the node's ElectionsDeferred at the last publishStatus;
	// deferredLog bounds their lines (deferredLogEvery, set in New).
	deferred    uint64
	deferredLog lograte.Limiter
	// precheckRefusals is the node's PreCheckRefusals at the last
	// publishStatus (the metric takes the difference).
	precheckRefusals uint64
}

// consensusInput handles one input, then (unless a Ready is stalled on a
// full log) carries out the node's Readys and publishes its status.
func (r *Replica) consensusInput(in consensusInput) {
	ls := &r.loop
	if !ls.started {
		s := r.node.Status()
		ls.lastLeader, ls.lastRole, ls.started = s.Leader, s.Role, true
		ls.batch = make([][]byte, 0, proposeBatchCmdsMax)
		ls.batchIDs = make([]uint64, 0, proposeBatchCmdsMax)
	}
	r.clk.markAlive()
	r.drainApplyBacklog() // room the apply loop made (apply_backlog.go)
	r.adoptInstalled()    // a snapshot's membership (members.go)
	if r.stalled != nil {
		// The node is between Ready and Advance: ticks and control
		// functions may add output (kept for the next Ready), never
		// change the stalled Ready.
		switch in.kind {
		case inTick:
			ls.tick = r.deliverTicks()
			if ls.tick-ls.stalledAt >= logFullRetryTicks {
				ls.stalledAt = ls.tick
				if r.finishReady(r.stalled) {
					r.stalled = nil
				}
			}
			if st := r.status.Load(); st != nil {
				r.watchProgress(st) // marks the node stuck; starts no hand-over while stalled
			}
		case inControl:
			r.syncClock()
			in.fn()
		case inOwnDurable:
			// Allowed between a Ready and its Advance (paxos ownvote.go).
			r.syncClock()
			r.reportOwn()
		}
		// Ticks go on while stalled: a leader that hears from no
		// majority steps down (check quorum), and its clients must learn
		// it, or they wait on it for as long as the stall lasts.
		if !testingStallHidesStatus {
			r.publishStatus()
		}
		return
	}
	switch in.kind {
	case inTick:
		// readExpiryTicks fails reads whose read index never came back
		// (a leader cut off from its quorum); their clients retry.
		readExpiryTicks := uint64(4 * r.cfg.ElectionTicks)
		due := r.deliverTicks()
		if due/uint64(r.cfg.ElectionTicks) != ls.tick/uint64(r.cfg.ElectionTicks) && due > readExpiryTicks {
			r.reads.expire(due-readExpiryTicks, ErrUnavailable)
		}
		ls.tick = due
		if st := r.status.Load(); st != nil {
			r.watchProgress(st) // stuck.go: a stuck leader hands over
		}
		r.drainOwnBacklog() // own entries that waited for room (own_backlog.go)
	case inInbound:
		m := in.msg
		r.stepInbound(m)
		for i := 0; i < inboundMsgsMax; i++ {
			select {
			case m = <-r.inbound:
				r.stepInbound(m)
				continue
			default:
			}
			break
		}
	case inPropose:
		batch, batchIDs := ls.batch[:0], ls.batchIDs[:0]
		bytes := 0
		p := in.prop
		now := r.stageNow()
		for {
			r.dequeued(&p, now)
			batch = append(batch, p.env)
			batchIDs = append(batchIDs, p.id)
			bytes += len(p.env)
			if len(batch) >= proposeBatchCmdsMax || bytes >= proposeBatchBytesMax {
				break
			}
			select {
			case p = <-r.proposeC:
				continue
			default:
			}
			break
		}
		r.propose(batch, batchIDs)
	case inDRR:
		batch, batchIDs := ls.batch[:0], ls.batchIDs[:0]
		bytes := 0
		now := r.stageNow()
		cmdsMax, bytesMax, engaged := r.drrBatchMax()
		for len(batch) < cmdsMax && bytes < bytesMax {
			p, _, ok := r.drr.Dequeue()
			if !ok {
				break
			}
			r.dequeued(&p, now)
			batch = append(batch, p.env)
			batchIDs = append(batchIDs, p.id)
			bytes += len(p.env)
		}
		if r.drr.Len() > 0 {
			// More waits: come back after serving what else is ready
			// (consensus messages stay ahead of client work).
			r.kickProposer()
		}
		if len(batch) > 0 {
			r.propose(batch, batchIDs)
			if engaged && testingTrackPipelinePeak.Load() {
				notePipelinePeak(r.pipelineBytes())
			}
		}
	case inMirror:
		r.step(in.msg)
	case inRead:
		r.readIndex(in.read)
	case inControl:
		r.syncClock()
		in.fn()
		if testingDelayAfterControl > 0 {
			time.Sleep(testingDelayAfterControl)
		}
	case inOwnDurable:
		r.syncClock()
		r.reportOwn()
	}

	// A Ready cut short by Close (finishReady returns at r.stop without
	// handing on its committed entries) ends the loop: the next Ready's
	// entries must not reach the apply loop past the ones dropped. Once
	// they did (a select that saw both the apply queue and r.stop ready
	// picks either): a follower SIGTERMed under load applied slots 1910,
	// 1911 and 1914, recorded 1914 applied, and never applied 1912-1913,
	// so its state machine diverged from the others' (e2e
	// TestSecretRotationUnderLoad, the replica-agreement check).
	for r.node.HasReady() && !r.stopped.Load() {
		rd := r.node.Ready()
		if !r.finishReady(&rd) {
			r.stalled, ls.stalledAt = &rd, r.clk.delivered
			r.metrics.LogStalls.Inc()
			break
		}
	}
	if st := r.status.Load(); r.stalled == nil && (st == nil || st.Role != paxos.RoleLeader) {
		// paxos logroom.go: fresh before the next input may campaign (a
		// leader does not; it reads the log's usage once per input anyway).
		r.declareLogRoom()
	}
	r.publishStatus()
}

// publishStatus stores the node's status for readers outside the loop and
// reports leader, role and deferred-election changes (consensus loop).
func (r *Replica) publishStatus() {
	ls := &r.loop
	s := r.node.Status()
	r.status.Store(&s)
	if r.accel != nil {
		r.accel.registers(&s)
	}
	r.metrics.setStatus(&s)
	if s.Leader != ls.lastLeader {
		r.metrics.LeaderChanges.Inc()
		r.log.Info().Uint64("leader", uint64(s.Leader)).Uint64("round", s.Promised.Round).Msg("leader changed")
		ls.lastLeader = s.Leader
	}
	if s.Role != ls.lastRole {
		// Why a node's role changed is what an operator asks first after
		// an unexpected election: a higher ballot seen (Promised beyond
		// the node's own) or a timer (check quorum, election timeout),
		// and whether the node's own loop had just stalled.
		r.log.Info().Str("from", ls.lastRole.String()).Str("to", s.Role.String()).
			Uint64("promised_round", s.Promised.Round).Uint64("promised_node", uint64(s.Promised.Node)).
			Uint64("last_stall_ticks", r.clk.lastGapTicks).
			Uint64("ticks_since_stall", r.clk.delivered-r.clk.lastGapAt).
			Msg("role changed")
		if ls.lastRole == paxos.RoleLeader {
			// Proposals in flight may or may not commit under the
			// next leader: their writers learn "unknown outcome".
			r.failAllWrites(ErrUnavailable)
			r.reads.failPending(r.notLeader(&s))
		}
		ls.lastRole = s.Role
	}
	if d := s.PreCheckRefusals; d > ls.precheckRefusals {
		r.metrics.PreCheckRefusals.Add(float64(d - ls.precheckRefusals))
		ls.precheckRefusals = d
	}
	if d := s.ElectionsDeferred; d != ls.deferred {
		r.metrics.ElectionsDeferred.Add(float64(d - ls.deferred))
		if ok, _ := ls.deferredLog.Allow(r.cfg.Now()); ok {
			used, capacity := r.alog.Usage()
			r.log.Warn().Uint64("deferred", d).Int64("log_used_bytes", used).Int64("log_capacity_bytes", capacity).
				Uint64("commit", uint64(s.Commit)).Uint64("last_slot", uint64(s.LastSlot)).
				Msg("election deferred: the entries this node would re-propose as leader do not fit in its acceptor log; it catches up first")
		}
		ls.deferred = d
	}
}

// propose hands a batch of envelopes to the node (consensus loop).
func (r *Replica) propose(batch [][]byte, ids []uint64) {
	r.syncClock()
	if err := r.node.Propose(batch); err != nil {
		r.rejectProposals(ids, err)
		return
	}
	r.timeline.proposed(ids, r.stageNow())
}

// step hands one message to the node with a current clock (consensus
// loop).
func (r *Replica) step(m paxos.Message) {
	r.syncClock()
	if err := r.node.Step(m); err != nil && !errors.Is(err, paxos.ErrBadMessage) {
		r.log.Debug().Err(err).Msg("step")
	}
}

// rejectProposals answers the writers of a batch paxos refused.
func (r *Replica) rejectProposals(ids []uint64, err error) {
	var res writeResult
	switch {
	case errors.Is(err, paxos.ErrNotLeader):
		s := r.node.Status()
		res.err = r.notLeader(&s)
	case errors.Is(err, paxos.ErrProposalsFull):
		res.err = ErrBusy
	default:
		res.err = fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	for _, id := range ids {
		r.answer(id, nil, res)
	}
}

// readIndex asks paxos for one read index for w and every read queued
// behind it. The clock is read after the last of them was received: if the
// lease is valid at that reading, no other leader can have committed
// anything by then, so the commit index at that moment is a read point
// inside every batched read's interval (arrival <= reading <= answer).
func (r *Replica) readIndex(w *readWaiter) {
	t := &r.reads
	b := &readBatch{waiters: []*readWaiter{w}}
	for len(b.waiters) < readQueueMax {
		select {
		case w = <-r.readC:
			b.waiters = append(b.waiters, w)
			continue
		default:
		}
		break
	}
	fail := func(err error) {
		for _, w := range b.waiters {
			w.ch <- err
		}
	}
	if t.pending+len(b.waiters) > readsPendingMax {
		fail(ErrBusy)
		return
	}
	b.tick = r.syncClock()
	t.nextID++
	id := t.nextID
	if err := r.node.ReadIndex(id); err != nil {
		s := r.node.Status()
		switch {
		case errors.Is(err, paxos.ErrNotLeader):
			fail(r.notLeader(&s))
		case errors.Is(err, paxos.ErrReadsFull):
			fail(ErrBusy)
		default:
			fail(fmt.Errorf("%w: %v", ErrUnavailable, err))
		}
		return
	}
	t.byID[id] = b
	t.pending += len(b.waiters)
}

// finishReady carries out the Ready contract for rd: persist, send, hand
// snapshot and committed entries to the apply loop, answer read indexes,
// Advance. It returns false, having done nothing after the failed step,
// when the acceptor log is full: the caller retries later with the same rd.
func (r *Replica) finishReady(rd *paxos.Ready) bool {
	r.readyTaken(rd) // stage stamps (stages.go)
	// 1. Durable first: an acceptor answers only what survives a crash;
	// the leader's own acceptances go to the persister (persister.go).
	if !r.persistReady(rd) {
		return false
	}
	r.admittedPersisted() // accept_admission.go
	// The peer tables follow membership changes before anything is sent
	// to a new member (members.go).
	r.noteConfChanges(rd)

	// 2. Send. Messages are encoded now: paxos may reuse their buffers
	// after Advance.
	if r.accel != nil {
		r.accel.sending(rd.Messages)
		r.accel.software(rd.AckEvents)
	}
	if len(rd.Messages) > 0 {
		out := make([]outMsg, 0, len(rd.Messages))
		// The leader's Accepts carry the same entries to every follower
		// (paxos shares one slice among them): those entries are encoded
		// once, and each message encodes its head alone (a megabyte
		// write was encoded, and its buffer zeroed, once a follower).
		var shared struct {
			first *paxos.Entry
			n     int
			body  []byte
		}
		for i := range rd.Messages {
			m := &rd.Messages[i]
			if m.To == r.cfg.ID {
				r.step(*m)
				continue
			}
			if r.accel != nil && r.accel.fast.alreadySent(m) {
				continue // the accel fast path sent this Accepted already
			}
			if m.Snapshot == nil && len(m.Entries) > 0 {
				if shared.first != &m.Entries[0] || shared.n != len(m.Entries) {
					shared.first, shared.n = &m.Entries[0], len(m.Entries)
					shared.body = paxos.AppendEntries(make([]byte, 0, paxos.EntriesSize(m.Entries)), m.Entries)
				}
				out = append(out, outMsg{to: m.To, b: paxos.AppendMessageHead(make([]byte, 0, paxos.MessageHeadBytes), m), body: shared.body})
				continue
			}
			out = append(out, outMsg{to: m.To, b: paxos.AppendMessage(make([]byte, 0, paxos.MessageSize(m)), m)})
		}
		select {
		case r.outbound <- out:
		case <-r.stop:
			return true
		}
	}
	r.readySent()

	// 3. Snapshot, then committed entries, in order, to the apply loop.
	if rd.Snapshot != nil {
		// The staged snapshot paxos accepted (snapshot_fetch.go).
		meta := paxos.SnapshotMeta{Slot: rd.Snapshot.Slot}
		r.chosen.installSlot = max(r.chosen.installSlot, meta.Slot) // chosen.go
		if !r.toApply(applyItem{install: &meta}, meta.Slot) {       // apply_backlog.go
			return true
		}
	}
	if rd.SnapshotOffer != nil {
		r.offerSnapshot(*rd.SnapshotOffer) // the fetcher's (snapshot_fetch.go)
	}
	if len(rd.Committed) > 0 {
		queued := r.stageNow()
		if !r.toApply(applyItem{entries: copyEntries(rd.Committed), queued: queued}, rd.Committed[len(rd.Committed)-1].Slot) {
			return true
		}
		r.readyCommitted(rd.Committed, queued)
	}

	// 4. Read indexes.
	for _, rs := range rd.ReadStates {
		b := r.reads.byID[rs.ID]
		if b == nil {
			continue // expired or failed already
		}
		delete(r.reads.byID, rs.ID)
		r.reads.pending -= len(b.waiters)
		r.reads.indexed(rs.Index, b.waiters, r.Applied)
	}
	r.node.Advance(*rd)
	return true
}

// copyEntries deep-copies entries: paxos may reuse their buffers after
// Advance while the apply loop still reads them. The copy takes three
// allocations whatever the number of commands (the entries, every
// command's slice header, every command's bytes), where one a command
// was most of a loaded node's allocations by count; each command is
// capped at its length, so appending to one never writes into the next.
func copyEntries(es []paxos.Entry) []paxos.Entry {
	ncmds, nbytes := 0, 0
	for i := range es {
		ncmds += len(es[i].Cmds)
		for _, c := range es[i].Cmds {
			nbytes += len(c)
		}
	}
	out := make([]paxos.Entry, len(es))
	cmds := make([][]byte, 0, ncmds)
	buf := make([]byte, 0, nbytes)
	for i, e := range es {
		out[i] = e
		if len(e.Cmds) == 0 {
			continue
		}
		start := len(cmds)
		for _, c := range e.Cmds {
			if len(c) == 0 {
				cmds = append(cmds, nil) // as append([]byte(nil), c...) gave
				continue
			}
			at := len(buf)
			buf = append(buf, c...)
			cmds = append(cmds, buf[at:len(buf):len(buf)])
		}
		out[i].Cmds = cmds[start:len(cmds):len(cmds)]
	}
	return out
}

// die reports a failure of the durable path: continuing could answer what
// is not durable, so the consensus loop stops doing anything.
func (r *Replica) die(err error) {
	r.log.Error().Err(err).Msg("fatal: the replica stops (its acceptor log or state machine failed)")
	r.reportFatal(err)
}

// checkLogUsage requests a snapshot when the acceptor log is past its
// usage threshold, at most once per election timeout (a snapshot cannot
// free entries above the applied slot, so asking again at once is futile).
func (r *Replica) checkLogUsage() {
	pct := r.cfg.LogSnapshotUsedPercent
	if pct <= 0 {
		pct = logSnapshotUsedPercent
	}
	used, capacity := r.alog.Usage()
	r.metrics.setLogUsage(used, capacity)
	r.noteChosen()
	if capacity <= 0 || used*100 < capacity*pct {
		return
	}
	if now := r.cfg.Now(); now.After(r.nextUsageSnap) {
		r.nextUsageSnap = now.Add(time.Duration(r.cfg.ElectionTicks) * r.cfg.Tick)
		r.requestSnapshot()
	}
}

// requestSnapshot asks the apply loop for a snapshot now (coalesced).
func (r *Replica) requestSnapshot() {
	select {
	case r.snapNow <- struct{}{}:
	default:
	}
}

// compacted runs on the consensus loop after the apply loop took a
// snapshot through slot: paxos may drop its log below it and the acceptor
// log may truncate.
func (r *Replica) compacted(slot, durable paxos.Slot) {
	r.chosen.storeDurable = max(r.chosen.storeDurable, durable) // chosen.go
	// Keep the log above a snapshot being served, and a catch-up tail
	// (snapshot_compact.go).
	slot = min(r.retainFloor(slot), r.catchUpFloor(slot))
	st := r.node.Status()
	// The state machine may be ahead of what paxos delivered (the accel
	// early path applies committed slots first): compact no further than
	// paxos's applied slot; the state served later is at or above it.
	slot = min(slot, st.Applied)
	if slot+1 <= st.FirstSlot {
		// Nothing more to compact in paxos, but the acceptor log may
		// still hold records below an installed snapshot (InstallSnapshot
		// moved FirstSlot; accept_admission.go): release them.
		if t := min(slot, durable) + 1; r.alog.TruncatedBelow() < t {
			if err := r.alog.TruncateBelow(t); err != nil {
				r.log.Warn().Err(err).Uint64("slot", uint64(slot)).Msg("truncating the acceptor log")
			}
			r.metrics.setLogUsage(r.alog.Usage())
		}
		return
	}
	// While a Ready is stalled on a full log, paxos is left alone (it is
	// between Ready and Advance); only the acceptor log truncates.
	if r.stalled == nil {
		if err := r.node.Compact(slot); err != nil {
			r.log.Warn().Err(err).Uint64("slot", uint64(slot)).Msg("compact")
			return
		}
	}
	if err := r.alog.TruncateBelow(min(slot, durable) + 1); err != nil {
		r.log.Warn().Err(err).Uint64("slot", uint64(slot)).Msg("truncating the acceptor log")
	}
	r.metrics.setLogUsage(r.alog.Usage())
}
