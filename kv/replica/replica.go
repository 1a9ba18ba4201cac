package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"synod/afxdp"
	"synod/internal/lograte"
	"synod/internal/stall"
	"synod/kv/proto"
	"synod/kv/sm"
	"synod/paxos"
	"synod/pmem"
	"synod/tenants"
)

// Peer is one member of the group.
type Peer struct {
	ID paxos.NodeID
	// ConsensusAddr receives datagrams (UDP) and, on the same port, the TCP
	// side channel.
	ConsensusAddr netip.AddrPort
	// ClientAddr is where clients reach this member (sent with NOT_LEADER).
	ClientAddr string
}

// Cores names the CPUs the loops are pinned to; -1 leaves a loop unpinned.
type Cores struct{ RX, TX, Consensus, Apply int }

// Unpinned leaves every loop to the Go scheduler.
var Unpinned = Cores{RX: -1, TX: -1, Consensus: -1, Apply: -1}

// Config configures a Replica.
type Config struct {
	ID        paxos.NodeID
	ClusterID uint64
	Peers     []Peer // every member, this one included
	// Tick is the period of paxos ticks (e.g. 1ms).
	Tick           time.Duration
	ElectionTicks  int
	HeartbeatTicks int
	LeaseTicks     int
	DriftTicks     int
	// SnapshotEverySlots overrides snapshotEverySlots when > 0.
	SnapshotEverySlots uint64
	// DeltaSnapshots makes this node, when it holds state, fetch a delta
	// (only the key ranges that differ: snapshot_fetch.go, kv/sm "Delta
	// snapshots") instead of the whole state. Off by default: on the
	// project's machines the delta moved 3-10x fewer bytes but took longer
	// (both ends hash their whole state; kv/README.md). A node serves delta
	// requests either way.
	DeltaSnapshots bool
	// CatchUpLogPercent, when > 0, makes compaction keep the newest slots
	// that fit in this share of the acceptor log's capacity below a
	// snapshot, so a follower that missed them catches up from the log
	// (log_tail.go). At most CatchUpLogPercentMax; 0 keeps only the tail
	// of every/catchUpTailDivisor slots.
	CatchUpLogPercent int
	// LogSnapshotUsedPercent overrides logSnapshotUsedPercent when > 0;
	// above 100 the log is compacted only when it is full (tests).
	LogSnapshotUsedPercent int64
	Cores                  Cores
	Log                    zerolog.Logger
	Metrics                *Metrics // nil: unregistered metrics
	Faults                 *Faults  // nil: a private hook that blocks nothing
	// Accel, when non-nil, runs the accel plane model beside paxos
	// ("soft" accel); nil is "off".
	Accel *AccelConfig
	// Tenants, when non-nil, puts a deficit-round-robin scheduler across
	// tenants in front of the proposer (tenants.DRR), so a tenant within
	// its contract is not queued behind one over it. Nil: one FIFO.
	Tenants *tenants.Registry
	// TenantMetrics receives the scheduler's queueing delays (may be nil).
	TenantMetrics *tenants.Metrics
	// Auth, when non-nil, seals every consensus datagram and side-channel
	// frame this node sends and refuses every one it receives that does
	// not open (auth.go); kvnode always sets it. Nil: no authentication
	// (in-process tests and the simulator).
	Auth *Auth
	// Now is the runtime's clock (nil: time.Now). The deterministic
	// simulator (replicasim_test.go) gives every node a simulated one.
	Now func() time.Time
	// Seed seeds paxos's election timer jitter (0: from the clock).
	Seed int64
	// Join starts a node that is not in the committed membership yet,
	// with an empty state machine (kvnode --join, members.go): it waits
	// to be added as a learner and catches up by snapshot; Peers are
	// then only the members it first listens to. Ignored when the state
	// machine holds state.
	Join bool
	// Stalls, when non-nil, is told of every stage that takes longer than
	// its threshold (stages.go); kvnode's [stall] table configures it.
	// Nil: stalls are neither counted nor logged.
	Stalls *stall.Detector

	// simulated: no goroutines, no side channel; the simulator drives
	// the loops one step at a time (replicasim_test.go).
	simulated bool
	// recoveredTail, when set (the simulator), is given the committed
	// tail recovery hands paxos (recover_tail.go), for its oracle.
	recoveredTail func(tail []paxos.Entry)
}

func (c *Config) validate() error {
	if c.ID == 0 {
		return errors.New("replica: node id 0 is reserved")
	}
	if len(c.Peers) == 0 || len(c.Peers) >= peersMax {
		return fmt.Errorf("replica: %d peers; want 1..%d", len(c.Peers), peersMax-1)
	}
	seen := map[paxos.NodeID]bool{}
	self := false
	for _, p := range c.Peers {
		if p.ID == 0 || p.ID >= peersMax {
			return fmt.Errorf("replica: peer id %d out of range 1..%d", p.ID, peersMax-1)
		}
		if seen[p.ID] {
			return fmt.Errorf("replica: duplicate peer id %d", p.ID)
		}
		if !p.ConsensusAddr.IsValid() {
			return fmt.Errorf("replica: peer %d has no consensus address", p.ID)
		}
		seen[p.ID] = true
		self = self || p.ID == c.ID
	}
	if !self {
		return fmt.Errorf("replica: node %d is not among the peers", c.ID)
	}
	if c.CatchUpLogPercent < 0 || c.CatchUpLogPercent > CatchUpLogPercentMax {
		return fmt.Errorf("replica: catch-up log share %d%% outside 0..%d", c.CatchUpLogPercent, CatchUpLogPercentMax)
	}
	if c.Tick <= 0 {
		return errors.New("replica: tick period must be positive")
	}
	if c.ElectionTicks <= 0 || c.HeartbeatTicks <= 0 || c.HeartbeatTicks >= c.ElectionTicks {
		return fmt.Errorf("replica: need 0 < heartbeat ticks (%d) < election ticks (%d)", c.HeartbeatTicks, c.ElectionTicks)
	}
	return nil
}

// Replica is one member of a synod group. Its Write and ReadBarrier methods
// are safe for concurrent use by many client goroutines.
type Replica struct {
	cfg     Config
	log     zerolog.Logger
	metrics *Metrics
	faults  *Faults
	node    *paxos.Node
	alog    AcceptorLog
	sm      StateMachine
	conn    afxdp.Conn
	side    *sideChannel
	// book is the address book and members the membership records
	// (consensus loop only), memberView what it publishes (members.go).
	book    atomic.Pointer[peerBook]
	members memberState
	removed atomic.Bool // outside the committed membership (members.go)
	joining atomic.Bool // joining with a cluster secret: may learn contacts (members.go)
	// learnedMask has bit id set for each contact a joiner learned
	// (members.go addContact), for the receive loop.
	learnedMask atomic.Uint64
	memberView  atomic.Pointer[memberView]
	// installedMembers: the membership of a snapshot the apply loop
	// installed, for the consensus loop to adopt.
	installedMembers atomic.Pointer[sm.Membership]

	inbound  chan paxos.Message
	proposeC chan proposal
	// drr, when non-nil, replaces proposeC: writers enqueue per tenant and
	// kick the consensus loop, which dequeues by deficit round robin.
	drr     *tenants.DRR[proposal]
	drrKick chan struct{} // cap 1
	// gateC wakes the consensus loop when its pipeline gate may open;
	// gated says it is closed (pipeline_gate.go).
	gateC    chan struct{} // cap 1
	gated    atomic.Bool
	mix      tenantMix // which tenants write (pipeline_gate.go)
	readC    chan *readWaiter
	controlC chan func()
	outbound chan []outMsg
	applyC   chan applyItem
	// applyBacklog holds what applyC had no room for (apply_backlog.go).
	applyBacklog applyBacklog
	// applyExited is closed when the apply loop returns (nil until Start
	// runs it).
	applyExited chan struct{}
	snapNow     chan struct{}

	// Snapshot transfers (snapshot_*.go): offers waiting for the fetcher,
	// one token per transfer served, the apply loop's word that a staged
	// snapshot was swapped in, and the log pins of served snapshots.
	snapOffers  chan paxos.SnapshotOffer
	snapServes  chan struct{}
	snapSwapped chan error
	pins        snapPins
	// snapRefuseLog bounds the lines of refused transfer connections on
	// a node without a cluster secret (with one, Auth's limiter does).
	snapRefuseLog lograte.Limiter
	// snapWholeNext: the last delta request got no answer; the next
	// transfer asks for a whole stream (snapshot_fetch.go).
	snapWholeNext atomic.Bool

	// boot is this process's boot id (envelope.go): random, never 0.
	boot         uint64
	nextProposal atomic.Uint64
	pendingMu    sync.Mutex
	pending      map[uint64]*writeWaiter // by proposal number of this boot
	// inflightWrites is len(pending), readable without the lock (the
	// overload guard's backlog).
	inflightWrites atomic.Int64
	// pendingBytes is the envelope bytes of the writes in pending (the
	// pipeline gate's byte bound), kept with inflightWrites.
	pendingBytes atomic.Int64
	// queuedBytes is the envelope bytes of the writes submitted and not
	// yet taken by the consensus loop (proposeC or the tenant scheduler),
	// at most proposeQueueBytesMax (submitWrite).
	queuedBytes atomic.Int64

	reads readTracker
	accel *accelMirror // nil when accel is off
	// progress shares STATUS requests' calls to the consensus loop
	// (status.go).
	progress progressCalls
	// disks holds the members' latest disk reports (disk_report.go).
	disks diskReports
	// watch says whether this node makes progress (stuck.go);
	// logUsage and logCapacity are the acceptor log's usage at its last
	// look (for the watch's log line, from any goroutine).
	watch                 progressWatch
	commitWait            commitWatch
	logUsage, logCapacity atomic.Int64
	// diskProbe reads this node's own disk (ShareDiskSpace; nil: unknown).
	diskProbe atomic.Pointer[func() DiskSpace]

	clk  loopClock // the node's clock (clock.go)
	loop loopState // consensus loop only
	// chosen is the chosen-through notes' bookkeeping (chosen.go;
	// consensus loop only).
	chosen chosenNotes

	// admit bounds the accepts stepped to the log's room (consensus loop
	// only; accept_admission.go).
	admit acceptAdmission
	// timeline stamps the slots this node proposes (stages.go;
	// consensus loop only); stallAfter is the stall threshold (0: off).
	timeline   timeline
	stallAfter time.Duration
	apply      applyState // apply loop only
	status     atomic.Pointer[paxos.Status]
	// applied is the last slot the apply loop applied, stored before that
	// slot's writes are answered: a write's answer implies Applied() >= its
	// slot (a test that waited for a follower to reach the leader's
	// Applied() after a write was answered read the follower before the
	// write, under -race).
	applied atomic.Uint64
	logFull atomic.Bool
	stalled *paxos.Ready // consensus loop only: a Ready whose persist hit a full log
	logTail logTail      // consensus loop only: log bytes appended above a slot (log_tail.go)
	// own is the persister's queue of the leader's own writes
	// (persister.go), ownBacklog the own writes the log had no room for
	// yet.
	own        ownWrites
	ownInline  bool          // set in New: own writes persisted on the consensus loop (ownPersistInline)
	tickWakes  atomic.Uint64 // the ticker's wake-ups of the consensus loop (tests)
	ownBacklog ownBacklog    // consensus loop only (own_backlog.go)
	// nextUsageSnap is the earliest time log usage may request another
	// snapshot (consensus loop only).
	nextUsageSnap time.Time
	// restoreMu is held for reading while a read touches the state
	// machine and for writing while a snapshot is restored (a restore
	// passes through partial states).
	restoreMu sync.RWMutex
	stopped   atomic.Bool

	stop     chan struct{} // closes the consensus, receive and send loops
	applyWG  sync.WaitGroup
	loopsWG  sync.WaitGroup
	closeOne sync.Once
	closeErr error
	fatal    chan error // a loop that cannot go on reports here
}

type proposal struct {
	id     uint64
	env    []byte
	queued int64 // stage clock (stages.go) when it was queued
}

type writeResult struct {
	res sm.Result
	err error
	// answered is when the apply loop answered (stage clock; 0 for an
	// error), slot the slot that held the write.
	answered int64
	slot     paxos.Slot
}

type writeWaiter struct {
	ch  chan writeResult // cap 1
	env []byte           // the envelope proposed: only its own entry answers it
}

type outMsg struct {
	to paxos.NodeID
	b  []byte
	// body, when not nil, follows b on the wire: the entries of an
	// Accept that went to every follower alike, encoded once and shared
	// by their messages (finishReady); read-only.
	body []byte
}

// size is the message's encoded size.
func (m *outMsg) size() int { return len(m.b) + len(m.body) }

// applyItem is a staged snapshot to swap in (one paxos accepted:
// snapshot_fetch.go) or committed entries to apply, in order.
type applyItem struct {
	install *paxos.SnapshotMeta
	entries []paxos.Entry
	queued  int64 // stage clock when offered to the apply loop (0: unknown)
}

// New recovers a replica from its acceptor log and state machine: the
// durable state handed to paxos is the promised ballot and the latest
// accepted entry of each slot above the state machine's applied slot.
// conn is the datagram transport bound to this member's consensus address.
func New(cfg Config, conn afxdp.Conn, alog AcceptorLog, stm StateMachine) (*Replica, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Faults == nil {
		cfg.Faults = &Faults{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Replica{
		cfg:      cfg,
		log:      cfg.Log,
		metrics:  cfg.Metrics,
		faults:   cfg.Faults,
		alog:     alog,
		sm:       stm,
		conn:     conn,
		inbound:  make(chan paxos.Message, inboundMsgsMax),
		proposeC: make(chan proposal, proposeQueueMax),
		readC:    make(chan *readWaiter, readQueueMax),
		controlC: make(chan func(), controlQueueMax),
		outbound: make(chan []outMsg, outboundBatchesMax),
		applyC:   make(chan applyItem, applyQueueBatchesMax),
		snapNow:  make(chan struct{}, 1),
		pending:  make(map[uint64]*writeWaiter),
		stop:     make(chan struct{}),
		fatal:    make(chan error, 4),

		snapOffers:  make(chan paxos.SnapshotOffer, snapshotFetchesMax),
		snapServes:  make(chan struct{}, snapshotServesMax),
		snapSwapped: make(chan error, 1),
	}
	r.reads.init(r.stageNow)
	r.own.init()
	switch alog.Mode() {
	case string(pmem.ModeShm), string(pmem.ModeDAX):
		r.ownInline = !cfg.simulated && !testingOwnPersistAsync
	}
	r.watch.noTargetLog.Every = stuckNoTargetLogEvery
	r.snapRefuseLog.Every = authRejectLogPeriod
	r.loop.deferredLog.Every = deferredLogEvery
	if cfg.Stalls != nil {
		r.stallAfter = cfg.Stalls.Threshold()
	}
	boot, err := newBootID()
	if err != nil {
		return nil, err
	}
	r.boot = boot
	if cfg.Tenants != nil {
		// A tenant's queue holds as many writes as the overload guard
		// lets its class have waiting node-wide, so a burst is shed
		// where the guard says (docs/protocol.md "Overload"), not earlier
		// by the queue; the guard's node-wide count bounds the sum.
		byClass := [3]int{tenants.ClassCritical: overloadCriticalBacklog, tenants.ClassStandard: overloadStandardBacklog, tenants.ClassBulk: overloadBulkBacklog}
		r.drr = tenants.NewDRR[proposal](cfg.Tenants, tenants.DRRConfig{QueueBytesMax: tenantQueueBytesMax(len(cfg.Tenants.All())), QueueItemsMaxByClass: byClass},
			cfg.Now, cfg.TenantMetrics)
		r.drrKick = make(chan struct{}, 1)
		r.gateC = make(chan struct{}, 1)
	}
	// The membership committed in the log, or the configured peers of a
	// new cluster (members.go).
	voters, learners, join, err := r.initMembership(&r.cfg, stm)
	if err != nil {
		return nil, err
	}

	used, ring := alog.Usage()
	if ring < AcceptorLogBytesMin {
		return nil, fmt.Errorf("replica: the acceptor log's ring holds %d bytes, below AcceptorLogBytesMin (%d): "+
			"it could not take every record a leader may send", ring, AcceptorLogBytesMin)
	}
	r.metrics.setLogUsage(used, ring)
	applied := paxos.Slot(stm.Applied())
	if tb := alog.TruncatedBelow(); applied+1 < tb {
		// The log was truncated below slots this state machine has not
		// applied: their accepted values are gone here. Starting would
		// let this acceptor answer Prepares with holes for slots that
		// may be chosen (and apply nothing for them).
		return nil, fmt.Errorf("%w: the state machine has applied through slot %d, but the acceptor log was truncated below slot %d "+
			"(was the state machine directory removed or replaced?); restore the state machine from a snapshot at slot >= %d, "+
			"or replace this node with a new member", ErrStateBehindLog, applied, tb, tb-1)
	}
	// The records from the tail's floor (recover_tail.go): the committed
	// tail at or below applied, the accepted entries above it.
	floor := tailFloor(applied, alog.TruncatedBelow(), paxos.Slot(stm.Installed()), r.members.slot)
	recoverStart := cfg.Now() // for the log line: how long recovery took
	promised, recovered, err := alog.Recover(floor - 1)
	if err != nil {
		return nil, fmt.Errorf("recovering the acceptor log: %w", err)
	}
	tail, accepted := splitTail(recovered, applied)
	st := paxos.DurableState{Promised: promised, Accepted: append(tail, accepted...), Applied: applied}
	if cl, ok := alog.(chosenLog); ok {
		st.Chosen = cl.Chosen() // chosen.go: committed at once, not re-proposed
		r.chosen.noted = st.Chosen
	}
	r.chosen.storeDurable = applied
	first := applied + 1 // paxos's first slot: the tail's, or above applied
	if len(tail) > 0 {
		first = tail[0].Slot
	}
	r.logTail.countRecovered(st.Accepted, first-1, ring)
	if cfg.recoveredTail != nil {
		cfg.recoveredTail(tail)
	}
	r.recoverPendingMembership(accepted)
	if applied > 0 {
		st.Snapshot = &paxos.SnapshotMeta{Slot: first - 1, Members: voters, Learners: learners}
	}
	node, err := paxos.NewNode(paxos.Config{
		ID:             cfg.ID,
		ClusterID:      cfg.ClusterID,
		Members:        voters,
		KnownNodes:     r.bookIDs(), // the address book
		Join:           join,
		ElectionTicks:  cfg.ElectionTicks,
		HeartbeatTicks: cfg.HeartbeatTicks,
		LeaseTicks:     cfg.LeaseTicks,
		DriftTicks:     cfg.DriftTicks,
		Seed:           paxosSeed(cfg),
		// With accel the plane's timer loop decides when to campaign
		// (accel_heartbeat.go), so a busy consensus loop does not.
		ExternalElection: cfg.Accel != nil,
		// Every member keeps room for the window (limits.go).
		InflightBytesMax: leaderInflightBytesMax,
		// Proposals made while slots are in flight share the next one.
		PipelineSlotsMax: pipelineSlots(),
		// Judges the log room declared for re-proposals (declareLogRoom).
		RecordOverheadBytes: acceptEntryOverheadBytes,
	}, st)
	if err != nil {
		return nil, fmt.Errorf("creating the paxos node: %w", err)
	}
	r.node = node
	r.declareLogRoom()            // a restart with a full log must not campaign at once (paxos logroom.go)
	r.clk.init(cfg.Tick, cfg.Now) // the node's tick 0 is now
	if cfg.Accel != nil {
		if r.accel, err = newAccelMirror(r, voters, promised); err != nil {
			return nil, err
		}
		r.accel.deliveredThrough(applied)
	}
	r.applied.Store(uint64(applied))
	s := node.Status()
	r.status.Store(&s)
	r.log.Info().Uint64("applied", uint64(applied)).Int("accepted", len(accepted)).
		Uint64("tail_from", uint64(first)).Int("tail_slots", len(tail)).
		Uint64("chosen_noted", uint64(st.Chosen)).Uint64("committed", uint64(s.Commit)).
		Uint64("promised_round", promised.Round).Uint64("promised_node", uint64(promised.Node)).
		Str("durability", alog.Mode()).Float64("took_ms", float64(cfg.Now().Sub(recoverStart).Microseconds())/1000).
		Msg("replica recovered")

	if cfg.simulated {
		return r, nil
	}
	self, _ := r.peer(cfg.ID)
	r.side, err = newSideChannel(self.ConsensusAddr.String(), nil, cfg.Auth, r.deliverSide, r.log.With().Str("loop", "side").Logger())
	if err != nil {
		return nil, err
	}
	r.side.refused = r.metrics.AuthRefused.Inc
	r.side.overtakenConns = r.metrics.InboundDropped.Inc
	r.side.serveSnapshot = r.serveSnapshotConn
	r.refreshPeers() // the side channel's peers, the senders admitted
	return r, nil
}

// paxosSeed is the election jitter seed: Config.Seed, or one from the clock.
func paxosSeed(cfg Config) int64 {
	if cfg.Seed != 0 {
		return cfg.Seed ^ int64(cfg.ID)
	}
	return cfg.Now().UnixNano() ^ int64(cfg.ID)
}

// Start runs the loops. Paxos offers lagging peers the state the state
// machine holds from the start (its metadata is in the durable state; the
// state is served from the store); if there is some, a compaction is also
// requested at once so the recovered log truncates.
func (r *Replica) Start() {
	r.side.start()
	r.loopsWG.Add(4)
	go r.receiveLoop()
	go r.sendLoop()
	go r.consensusLoop()
	go r.fetchLoop()
	r.loopsWG.Add(1)
	go r.persistLoop() // the leader's own writes (persister.go)
	if r.accel != nil {
		r.accel.startTimers()
	}
	r.applyWG.Add(1)
	r.applyExited = make(chan struct{})
	go r.applyLoop()
	if !r.cfg.simulated {
		r.loopsWG.Add(1)
		go r.watchdogLoop() // stuck.go
	}
	if r.applied.Load() > 0 {
		r.requestSnapshot()
	}
}

// Fatal returns a channel that receives an error when a loop cannot go on
// (e.g. the acceptor log failed); the process should exit.
func (r *Replica) Fatal() <-chan error { return r.fatal }

// Faults returns the replica's fault hook.
func (r *Replica) Faults() *Faults { return r.faults }

// Metrics returns the replica's metrics.
func (r *Replica) Metrics() *Metrics { return r.metrics }

// Mode is the acceptor log's durability mode.
func (r *Replica) Mode() string { return r.alog.Mode() }

// Status returns the latest paxos status the consensus loop published,
// with Applied set to what the apply loop has applied.
func (r *Replica) Status() paxos.Status {
	s := *r.status.Load()
	s.Applied = paxos.Slot(r.applied.Load())
	return s
}

// LeaseValidNow reports whether s, a Status of this replica, is a
// leader's whose lease is still valid by the monotonic clock now: Status
// is the consensus loop's view as of its last iteration, and a loop
// stalled (starved of CPU, or blocked) keeps saying "leader, lease valid"
// after the lease ran out and another node was elected (an outside
// tester saw a deposed leader's /status say leader for 3.4 s). The lease
// ends at the epoch plus LeaseUntil ticks, no later than the node itself
// would judge it (its clock lags real time by less than a tick). Reads
// never rely on this: the loop checks its lease with every owed tick
// delivered (clock.go).
func (r *Replica) LeaseValidNow(s *paxos.Status) bool {
	return s.LeaseValid && r.clk.since() < time.Duration(s.LeaseUntil)*r.clk.period
}

// LoopIdle is how long ago the consensus loop last began an iteration:
// how old Status's view may be.
func (r *Replica) LoopIdle() time.Duration { return r.clk.sinceAlive() }

// Applied is the highest slot applied to the state machine.
func (r *Replica) Applied() paxos.Slot { return paxos.Slot(r.applied.Load()) }

// PeerClientAddr returns the client address of member id ("" if unknown).
func (r *Replica) PeerClientAddr(id paxos.NodeID) string {
	p, _ := r.peer(id)
	return p.ClientAddr
}

func (r *Replica) notLeader(s *paxos.Status) error {
	return &NotLeaderError{Leader: s.Leader, ClientAddr: r.PeerClientAddr(s.Leader)}
}

// Write proposes cmd and waits until it is applied, returning the state
// machine's result. Errors: ErrTooLarge (cmd exceeds CommandBytesMax;
// nothing proposed), *NotLeaderError, ErrBusy, ErrLogFull, ErrUnavailable,
// ErrStopped or ctx's error (for the last three the outcome is unknown).
func (r *Replica) Write(ctx context.Context, tenant tenants.ID, cmd []byte) (sm.Result, error) {
	start := r.cfg.Now()
	w, id, err := r.submitWrite(tenant, cmd)
	if err != nil {
		return sm.Result{}, err
	}
	return r.awaitWrite(ctx, w, id, start)
}

// WriteRequest is Write of sm.EncodeCommand(tenant, req), the command
// encoded straight into its envelope (one copy of the value fewer).
func (r *Replica) WriteRequest(ctx context.Context, tenant tenants.ID, req *proto.Request) (sm.Result, error) {
	start := r.cfg.Now()
	env := sm.AppendCommand(envelopeRoom(sm.CommandBytes(req)), tenant, req)
	w, id, err := r.submitEnvelope(tenant, env)
	if err != nil {
		return sm.Result{}, err
	}
	return r.awaitWrite(ctx, w, id, start)
}

// awaitWrite waits for the answer of the write submitted as id (w), until
// ctx ends or the replica stops; a write given up on is forgotten.
func (r *Replica) awaitWrite(ctx context.Context, w *writeWaiter, id uint64, start time.Time) (sm.Result, error) {
	select {
	case res := <-w.ch:
		if res.err == nil {
			r.metrics.CommitLatency.Observe(r.cfg.Now().Sub(start).Seconds())
			if res.answered != 0 {
				r.writeStageTook(wsReply, r.since(res.answered, r.stageNow()), res.slot)
			}
		}
		return res.res, res.err
	case <-ctx.Done():
		r.forget(id)
		return sm.Result{}, ctx.Err()
	case <-r.stop:
		r.forget(id)
		return sm.Result{}, ErrStopped
	}
}

// submitWrite wraps cmd in its envelope, registers its writer and queues
// the proposal; the writer's channel receives the answer (Write waits on
// it; the simulator polls it). It never blocks.
func (r *Replica) submitWrite(tenant tenants.ID, cmd []byte) (*writeWaiter, uint64, error) {
	env := envelopeRoom(len(cmd))
	return r.submitEnvelope(tenant, append(env, cmd...))
}

// submitEnvelope is submitWrite of the command env[envelopeHeaderBytes:];
// it writes the envelope's header into env[:envelopeHeaderBytes] and
// keeps env.
func (r *Replica) submitEnvelope(tenant tenants.ID, env []byte) (*writeWaiter, uint64, error) {
	cmd := env[envelopeHeaderBytes:]
	if len(cmd) > CommandBytesMax {
		// No acceptor log could hold it: refused here, before it can
		// reach paxos or the log (the size chain, limits.go).
		return nil, 0, fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, len(cmd), CommandBytesMax)
	}
	if r.stopped.Load() {
		return nil, 0, ErrStopped
	}
	s := r.status.Load()
	if s.Role != paxos.RoleLeader {
		return nil, 0, r.notLeader(s)
	}
	if r.logFull.Load() {
		return nil, 0, ErrLogFull
	}
	id := r.nextProposal.Add(1)
	putEnvelopeHeader(env, proposalID{origin: r.cfg.ID, boot: r.boot, seq: id})
	if n := int64(len(env)); r.drr != nil {
		// The scheduler bounds each tenant's queue, and their sum
		// (tenantQueueBytesMax): a node-wide check here would let
		// tenants that fill their queues refuse another tenant's first
		// write. The bytes are counted queued after the write is
		// pending (below), so the pipeline gate's count of bytes
		// proposed (pending less queued) only ever runs high for that
		// moment, closing the gate early, never late.
	} else if !r.reserveQueued(n) {
		return nil, 0, fmt.Errorf("%w: %d bytes of writes wait to be proposed (at most %d)", ErrBusy, r.queuedBytes.Load(), proposeQueueBytesMax)
	}
	w := &writeWaiter{ch: make(chan writeResult, 1), env: env}
	r.pendingMu.Lock()
	r.pending[id] = w
	r.inflightWrites.Store(int64(len(r.pending)))
	r.pendingBytes.Add(int64(len(env)))
	r.pendingMu.Unlock()
	p := proposal{id: id, env: env, queued: r.stageNow()}
	if r.drr != nil {
		r.queuedBytes.Add(int64(len(env)))
		r.mix.note(tenant, r.cfg.Now())
		if err := r.drr.Enqueue(tenant, len(p.env), p); err != nil {
			r.forget(id)
			r.queuedBytes.Add(-int64(len(p.env)))
			if errors.Is(err, tenants.ErrQueueFull) {
				return nil, 0, ErrBusy
			}
			return nil, 0, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		r.kickProposer()
		return w, id, nil
	}
	select {
	case r.proposeC <- p:
		return w, id, nil
	default:
		r.forget(id)
		r.queuedBytes.Add(-int64(len(p.env)))
		return nil, 0, ErrBusy
	}
}

// reserveQueued takes n bytes of proposeQueueBytesMax for a write about
// to be queued without a tenant scheduler; false, with nothing taken, when
// they do not fit. A write into an empty queue always fits (the largest
// write passes). The bytes are given back when the consensus loop takes
// the write (dequeued) or the queue refuses it.
func (r *Replica) reserveQueued(n int64) bool {
	return reserveBytes(&r.queuedBytes, n, proposeQueueBytesMax)
}

// reserveBytes adds n to the bytes a queue holds (held) if they stay
// within bytesMax, or if the queue held nothing (one item of any size
// passes); false, with nothing added, otherwise. The queue gives the bytes
// back (held.Add(-n)) when the item leaves it.
func reserveBytes(held *atomic.Int64, n, bytesMax int64) bool {
	if q := held.Add(n); q > bytesMax && q != n {
		held.Add(-n)
		return false
	}
	return true
}

// kickProposer wakes the consensus loop to drain the scheduler (coalesced).
func (r *Replica) kickProposer() {
	select {
	case r.drrKick <- struct{}{}:
	default:
	}
}

func (r *Replica) forget(id uint64) {
	r.pendingMu.Lock()
	if w := r.pending[id]; w != nil {
		r.pendingBytes.Add(-int64(len(w.env)))
	}
	delete(r.pending, id)
	r.inflightWrites.Store(int64(len(r.pending)))
	r.pendingMu.Unlock()
}

// answer hands a result to the writer waiting for proposal number id of
// this boot, if any. With env non-nil (a committed entry's envelope) the
// writer is answered only when env is the envelope it proposed: a result
// never reaches a writer whose command it is not. A mismatch is a bug
// (proposal ids are unique across lives); it is logged and counted, and the
// writer keeps waiting for its own entry (or the leader change or deadline
// that answers it UNAVAILABLE).
func (r *Replica) answer(id uint64, env []byte, res writeResult) {
	r.pendingMu.Lock()
	w := r.pending[id]
	if w != nil && env != nil && !TestingReusedProposalIDs && !bytes.Equal(w.env, env) {
		r.pendingMu.Unlock()
		r.metrics.AnswerMismatches.Inc()
		r.log.Error().Uint64("proposal", id).Msg("a committed command names a waiting writer but is not its command; not answered")
		return
	}
	if w != nil {
		r.pendingBytes.Add(-int64(len(w.env)))
	}
	delete(r.pending, id)
	r.inflightWrites.Store(int64(len(r.pending)))
	r.pendingMu.Unlock()
	if w != nil {
		w.ch <- res
	}
	r.gateWake()
}

// failAllWrites answers every waiting writer with err (leadership lost: the
// outcome of their proposals is unknown).
func (r *Replica) failAllWrites(err error) {
	r.pendingMu.Lock()
	old := r.pending
	r.pending = make(map[uint64]*writeWaiter)
	r.inflightWrites.Store(0)
	r.pendingBytes.Store(0)
	r.pendingMu.Unlock()
	for _, w := range old {
		w.ch <- writeResult{err: err}
	}
	r.gateWake()
}

// ReadBarrier returns once a linearizable read may be served from the
// local state machine: this replica leads, confirmed a read index after
// the call began, and has applied through it. Errors: *NotLeaderError,
// ErrBusy, ErrUnavailable, ErrStopped or ctx's error.
func (r *Replica) ReadBarrier(ctx context.Context) error {
	start := r.cfg.Now()
	w, err := r.submitRead()
	if err != nil {
		return err
	}
	select {
	case err := <-w.ch:
		if err == nil {
			r.metrics.ReadLatency.Observe(r.cfg.Now().Sub(start).Seconds())
			r.readStagesTook(w)
		}
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-r.stop:
		return ErrStopped
	}
}

// submitRead queues a read barrier; the waiter's channel receives nil once
// the state machine may be read. It never blocks.
func (r *Replica) submitRead() (*readWaiter, error) {
	if r.stopped.Load() {
		return nil, ErrStopped
	}
	s := r.status.Load()
	if s.Role != paxos.RoleLeader {
		return nil, r.notLeader(s)
	}
	w := &readWaiter{ch: make(chan error, 1), queued: r.stageNow()}
	select {
	case r.readC <- w:
		return w, nil
	default:
		return nil, ErrBusy
	}
}

// Close stops the replica: new requests are refused, the network loops and
// the consensus loop stop, the apply loop finishes what was committed and
// queued, then the transport and the acceptor log close. Writes that were
// acknowledged are durable in a majority of acceptor logs already. Close
// does not close the state machine (its owner does, after Close).
func (r *Replica) Close() error {
	r.closeOne.Do(func() {
		r.stopped.Store(true)
		close(r.stop)
		r.conn.Close() // unblocks the receive loop
		r.loopsWG.Wait()
		if r.side != nil { // nil in the simulator
			r.side.close()
		}
		r.flushApplyBacklog() // what was committed is applied (apply_backlog.go)
		close(r.applyC)
		r.applyWG.Wait()
		r.failAllWrites(ErrStopped)
		r.reads.failAll(ErrStopped)
		r.closeErr = r.alog.Close()
		if r.accel != nil {
			if err := r.accel.close(); err != nil && r.closeErr == nil {
				r.closeErr = err
			}
		}
	})
	return r.closeErr
}

func (r *Replica) reportFatal(err error) {
	select {
	case r.fatal <- err:
	default:
	}
}

// pinCPU pins the calling loop goroutine to cpu; -1 leaves it unpinned.
func pinCPU(cpu int) error {
	if cpu < 0 {
		return nil
	}
	return afxdp.PinToCPU(cpu)
}
