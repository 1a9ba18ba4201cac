package replica

import (
	"sync"
	"sync/atomic"
	"time"

	"synod/internal/lograte"
	"synod/paxos"
)

// A leader that cannot finish what it commits steps aside.
//
// A node is stuck when, for stuckAfter, either its apply loop has had
// committed slots waiting and applied none of them (Pebble waiting on a
// flush that a full disk fails, a hung device; or a leader's own persist
// of the acceptor log that never returns: its slots commit with its
// followers' votes but are delivered only once its own copy is durable),
// or its acceptor log has
// stood at the admission line (accept_admission.go) or full with nothing
// truncated (a snapshot that cannot be written), or, leading, it has had
// own acceptances not durable (paxos Status.OwnUndurable: waiting for room
// in a full log, or a persist that hangs) and none reported durable: its
// own vote counts for nothing, and with one follower behind, nothing
// commits (the wedge of e2e TestFullLogStaysLive, where the leader's
// re-proposals waited 60 s for room in its log full of the same values
// under the old ballot). A stuck leader keeps its followers, because its
// heartbeats wait for none of these (the persister runs off the consensus
// loop, and committed batches the apply queue has no room for wait in the
// apply backlog, apply_backlog.go, which a leader stops feeding at half
// its bound by taking no new writes), so no election would ever replace
// it: it would hold every write (refused THROTTLED or held behind the log) and
// every linearizable read (which waits for apply) until an operator killed
// it, while the other members could serve.
//
// So a stuck leader hands leadership over at once (paxos
// TransferLeadershipNow) to a voter whose report (disk_report.go), fresh
// within diskReportStaleAfter, says it is not stuck and can read its
// disk, preferring one not below its disk reserve, then one that knows
// more slots chosen (its reported commit index), then the lowest id; at
// most once per stuckTransferEvery. At once, not the operator's ordinary
// hand-over, which waits until nothing is in flight: a stuck leader may
// never get there (its own vote waiting for room in a full acceptor log,
// a follower's log as full: e2e TestFullLogStaysLive in CI, no write for
// 60 s, the hand-over started every 2 s and abandoned every time). If the
// target is not elected, an ordinary election follows, this node may lead
// again, and the next hand-over goes to another voter first. Every
// node's reports say whether it is stuck (their stuck flag), so a leader
// never hands over to a stuck node and the new leader never hands back to
// the one that stepped aside while it stays stuck. A leader that has no
// fresh report from such a voter keeps leading and says why in its log:
// stepping down blind could hand the cluster to a node as broken, or to
// one of a version that sends no reports.
//
// Stepping aside changes who serves, never what is stored: the transfer is
// paxos's own, and the node goes on as a follower that catches up once
// its disk or device recovers.
const (
	// stuckAfter is how long a node may make no progress with work
	// waiting before it counts as stuck: far above any pause of a healthy
	// node (a Pebble write stall or a snapshot lasts milliseconds to a
	// second here), far below what a client retries for.
	stuckAfter = 5 * time.Second
	// stuckTransferEvery is the least time between two hand-overs a stuck
	// leader starts (a hand-over paxos abandons ends within an election
	// timeout; the next one goes to another voter first).
	stuckTransferEvery = 2 * time.Second
	// stuckNoTargetLogEvery bounds the "no voter to hand over to" lines.
	stuckNoTargetLogEvery = 30 * time.Second
	// stuckCheckEvery is how often the consensus loop (on ticks) and the
	// progress watchdog look.
	stuckCheckEvery = 100 * time.Millisecond
)

// progressWatch says whether this node makes progress. The apply check
// runs on two goroutines under mu: the consensus loop's ticks and the
// progress watchdog (watchdogLoop), because the consensus loop itself can
// block behind a stalled apply loop (a full apply backlog on a follower)
// and would then never look; the log check and the hand-over run on the
// consensus loop only (they read its state).
type progressWatch struct {
	mu sync.Mutex
	// applied is the applied slot at the last look; applyWaitSince when
	// slots above it were first seen waiting with it unchanged (zero:
	// nothing waits).
	applied        uint64
	applyWaitSince time.Time
	// why names what is stuck ("" while nothing is).
	why string

	// Consensus loop only.
	checked time.Time
	// truncated is the acceptor log's truncation point at the last look;
	// heldSince when the log was first seen at the admission line (or
	// full) with it unchanged (zero: below the line).
	truncated    paxos.Slot
	heldSince    time.Time
	nextTransfer time.Time
	// noTargetLog bounds the "no voter to hand over to" lines
	// (stuckNoTargetLogEvery, set in New).
	noTargetLog lograte.Limiter
	// lastTarget is the voter the last hand-over went to; while this node
	// still leads, that hand-over did not complete, and the next one goes
	// to another voter when there is one.
	lastTarget paxos.NodeID

	// ownReports counts the leader's own writes reported durable
	// (reportOwn), ownSeen is its value at the last look, and ownWaitSince
	// is when the leader was first seen with own acceptances not durable
	// and ownReports unchanged (zero: none wait).
	ownReports, ownSeen uint64
	ownWaitSince        time.Time

	logStuck atomic.Bool // the log check's verdict (consensus loop)
	ownStuck atomic.Bool // the own-vote check's verdict (consensus loop)
	stuck    atomic.Bool
}

// Stuck reports whether this node has made no progress with work waiting
// for stuckAfter (apply or log truncation): what its disk reports say.
// Safe from any goroutine.
func (r *Replica) Stuck() bool { return r.watch.stuck.Load() }

// evalStuck updates the apply check from the applied slot and the latest
// published commit, combines it with the log check, and publishes and
// logs a change (any goroutine). It returns what is stuck ("" nothing).
func (r *Replica) evalStuck(now time.Time) string {
	w := &r.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	var commit uint64
	if st := r.status.Load(); st != nil {
		commit = uint64(st.Commit)
	}
	applied := r.applied.Load()
	switch {
	case applied >= commit:
		w.applyWaitSince = time.Time{}
	case applied != w.applied || w.applyWaitSince.IsZero():
		w.applyWaitSince = now
	}
	w.applied = applied
	why := ""
	switch {
	case !w.applyWaitSince.IsZero() && now.Sub(w.applyWaitSince) >= stuckAfter:
		why = "apply"
	case w.logStuck.Load():
		why = "log"
	case w.ownStuck.Load():
		why = "own_vote"
	}
	if why != w.why {
		if why != "" {
			used, capacity := r.logUsage.Load(), r.logCapacity.Load()
			r.log.Warn().Str("stuck_on", why).Uint64("applied", applied).Uint64("commit", commit).
				Int64("log_used_bytes", used).Int64("log_capacity_bytes", capacity).Dur("for", stuckAfter).
				Msg("this node has made no progress with work waiting: its reports say it is stuck (a leader hands over)")
		} else {
			r.log.Info().Str("was_stuck_on", w.why).Uint64("applied", applied).Msg("progress again: no longer stuck")
		}
		w.why = why
		w.stuck.Store(why != "")
		r.metrics.setStuck(why != "")
	}
	return why
}

// watchdogLoop runs the apply check off the consensus loop, which a
// stalled apply loop can block (progressWatch). Not in the simulator,
// whose consensus loop never blocks and must stay deterministic.
func (r *Replica) watchdogLoop() {
	defer r.loopsWG.Done()
	t := time.NewTicker(stuckCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.evalStuck(r.cfg.Now())
		}
	}
}

// watchProgress runs the log check and, on a stuck leader, starts a
// hand-over (consensus loop, on ticks; s is the published status).
func (r *Replica) watchProgress(s *paxos.Status) {
	w := &r.watch
	now := r.cfg.Now()
	if now.Sub(w.checked) < stuckCheckEvery {
		return
	}
	w.checked = now

	used, capacity := r.alog.Usage()
	r.logUsage.Store(used)
	r.logCapacity.Store(capacity)
	held := r.stalled != nil || (capacity > 0 && used >= admitBytesMax(capacity))
	truncated := r.alog.TruncatedBelow()
	switch {
	case !held:
		w.heldSince = time.Time{}
	case truncated != w.truncated || w.heldSince.IsZero():
		w.heldSince = now
	}
	w.truncated = truncated
	w.logStuck.Store(!w.heldSince.IsZero() && now.Sub(w.heldSince) >= stuckAfter)

	switch {
	case s.Role != paxos.RoleLeader || s.OwnUndurable == 0:
		w.ownWaitSince = time.Time{}
	case w.ownReports != w.ownSeen || w.ownWaitSince.IsZero():
		w.ownWaitSince = now
	}
	w.ownSeen = w.ownReports
	w.ownStuck.Store(!w.ownWaitSince.IsZero() && now.Sub(w.ownWaitSince) >= stuckAfter && !testingNoOwnVoteStuck.Load())

	r.watchCommit(s, now)
	why := r.evalStuck(now)
	if why == "" || s.Role != paxos.RoleLeader || s.Transferring != 0 || r.stalled != nil || now.Before(w.nextTransfer) {
		// A stalled Ready leaves paxos alone until it is carried out
		// (consensus.go); the watch tries again once it is.
		return
	}
	w.nextTransfer = now.Add(stuckTransferEvery)
	commits := map[paxos.NodeID]paxos.Slot{}
	for _, p := range r.node.PeerProgress() {
		if p.Reported {
			commits[p.ID] = p.Commit
		}
	}
	to, seen := r.disks.stepDownTarget(now, s.Members, r.cfg.ID, w.lastTarget, commits)
	if to == 0 {
		r.metrics.stuckTransfer("no_target")
		if ok, _ := w.noTargetLog.Allow(now); ok {
			r.log.Warn().Str("stuck_on", why).Int("fresh_reports", seen).
				Msg("stuck leader: no voter reports itself able to lead (not stuck, disk readable); keeping leadership")
		}
		return
	}
	transfer := r.node.TransferLeadershipNow
	if testingStuckHandOverWaits.Load() {
		transfer = r.node.TransferLeadership // planted: the operator's hand-over, which waits for commit == last
	}
	if err := transfer(to); err != nil {
		r.metrics.stuckTransfer("refused")
		r.log.Warn().Err(err).Uint64("to", uint64(to)).Msg("stuck leader: the hand-over did not start")
		return
	}
	if w.lastTarget != 0 {
		r.log.Warn().Uint64("previous", uint64(w.lastTarget)).Msg("stuck leader: the previous hand-over did not complete")
	}
	w.lastTarget = to
	r.metrics.stuckTransfer("started")
	r.log.Warn().Str("stuck_on", why).Uint64("to", uint64(to)).Msg("stuck leader: handing leadership over")
}
