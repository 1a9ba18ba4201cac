package paxossim

import (
	"fmt"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"

	"synod/paxos"
)

// Run-length defaults and bounds, in ticks.
const (
	// TicksDefault is the length of the fault phase of a default run.
	TicksDefault = 250
	// LivenessTicksMax bounds the liveness phase: once every fault has
	// healed, every pending operation must complete and every replica must
	// catch up within this many ticks, or the run reports a violation.
	LivenessTicksMax = 400

	stepMicros    = 250 // simulation step: four per tick
	readyLoopsMax = 64  // Ready rounds after one input before we call the node stuck
	clusterID     = 0x5350
)

// Node timing handed to paxos.Config. The lease and drift bound satisfy
// leaseTicks * 2 * driftPPMMax / 1e6 < driftTicks, so the drift the
// simulator injects stays within the bound the protocol assumes.
const (
	electionTicks  = 10
	heartbeatTicks = 2
	leaseTicks     = 8
	driftTicks     = 2
)

// Options configures one run. The zero value is a default run whose node
// count, client count and fault profile all come from the seed.
type Options struct {
	Ticks   int      // fault-phase length; 0 means TicksDefault
	Nodes   int      // 0: 3 or 5, chosen by the seed
	Clients int      // 0: 2 to 6, chosen by the seed
	Faults  FaultSet // 0: a random profile chosen by the seed
	// NoFaults forces a run without faults (Faults is then ignored).
	NoFaults bool
	// Intensity multiplies the per-tick rates of crashes, partitions and
	// membership changes (0 and 1: the default rates).
	Intensity int
	// MembershipHeavy runs the membership-heavy profile: many quick
	// remove/add cycles (fresh node ids among them) under partitions,
	// one-way links, crashes, drops, duplicates and reordering (unless
	// Faults names the kinds).
	MembershipHeavy bool
	// LeaderTransfers asks the leader to hand leadership over now and
	// then (leadership.go; the membership-heavy profile does too).
	LeaderTransfers bool
	// InflightBytesMax sets every node's paxos.Config.InflightBytesMax
	// (0: no byte bound on the leader's window).
	InflightBytesMax int
	// PipelineSlotsMax sets every node's paxos.Config.PipelineSlotsMax
	// (0: the default window).
	PipelineSlotsMax int

	// Trace, when set, receives a line for every notable event.
	Trace func(string)
	// OnReady is called for every Ready a node produces, after the
	// simulator handled it and before Advance. rd must not be retained.
	OnReady func(node paxos.NodeID, rd *paxos.Ready)
	// OnDeliver is called for every message delivered to a live node,
	// after decoding and before Step.
	OnDeliver func(m *paxos.Message)
	// OnStart is called whenever a node starts: at the beginning of the
	// run, on every restart after a crash (the node then holds only its
	// durable store) and when a fresh node joins; before the node's first
	// Ready. State a runtime keeps beside a node (an accel plane) starts
	// afresh here; nothing is called when a node crashes, and a crashed
	// node gets no OnReady, OnDeliver or OnStatus until OnStart.
	OnStart func(node paxos.NodeID)
	// OnStatus is called with a live node's Status after the simulator
	// drained its Ready rounds for one input (a tick, a message, a
	// proposal...), where a runtime refreshes what it derives from Status.
	// st must not be retained.
	OnStatus func(node paxos.NodeID, st *paxos.Status)
	// OnOwnDurable is called when a leader's own acceptances of slots
	// first..last under ballot b become durable (ownpersist.go), before
	// the node is told (OwnAcceptedDurable): where a runtime counts the
	// leader's vote in its accel plane.
	OnOwnDurable func(node paxos.NodeID, b paxos.Ballot, first, last paxos.Slot)

	// Planted bugs, for tests that show the checks catch them.
	plantDivergence paxos.NodeID // this node applies every 7th slot wrongly
	plantStaleReads bool         // reads skip ReadIndex and answer from local state
}

// Result summarizes one run.
type Result struct {
	Seed       uint64
	Nodes      int
	Clients    int
	Faults     FaultSet
	Ops        int // client operations completed
	Calls      int // client operations started
	Retries    int
	FaultCount int // injected fault events (crashes, partitions, lost/duplicated/delayed messages, membership changes)
	Violations int
	// SafetyViolations counts the end-to-end safety violations among
	// Violations (see checker.safety).
	SafetyViolations int
	// Messages describes up to violationsMax violations.
	Messages []string
	Net      netStats
	Commit   paxos.Slot // highest slot applied anywhere
	Counts   Counts
	// LeaseChecks counts the lease oracle's checks (lease.go); its
	// violations, LeaseViolations, are among SafetyViolations too.
	LeaseChecks, LeaseViolations int
	// QuorumChecks counts the voter-quorum oracle's judged claims
	// (check_quorum.go); its violations, QuorumViolations, are among
	// Violations but not SafetyViolations.
	QuorumChecks, QuorumViolations int
}

// Counts tallies the discrete events of a run, so a batch can show that
// every fault kind actually happened.
type Counts struct {
	Crashes, MidReadyCrashes, TotalCrashes, Partitions, OneWays, ConfChanges, FreshNodes int
	SnapshotsInstalled, Compactions, LeaseOrBarrierReads                                 int
	Pauses                                                                               int
	// Snapshot transfers (transfer.go): started, failed (link or server
	// lost), stale (refused by InstallSnapshot: late or overtaken), and
	// crashes between staging and installing.
	TransfersStarted, TransfersFailed, TransfersStale, StagedCrashes int
	// The leaders' own writes (ownpersist.go): issued, stalled past an
	// election timeout, completed out of issue order, superseded by a
	// later acceptance, lost in a crash, survived a crash unreported; and
	// crashes between a leader's sends and its write, and of a leader
	// whose write was in flight for a heartbeat period.
	OwnWrites, OwnWritesSlow, OwnWritesReordered, OwnWritesSuperseded   int
	OwnWritesLost, OwnWritesSurvived, CrashesAfterSend, CrashesInFlight int
	// Membership-heavy learners (membership.go): learners added, promoted,
	// fresh nodes started in Join mode; leadership hand-overs started and
	// completed (leadership.go).
	Learners, Promotions, Joins, Transfers, TransfersDone int
	// TransfersNow: of Transfers, those asked as hand-overs at once
	// (paxos TransferLeadershipNow: no wait for the slots in flight).
	TransfersNow int
	// Re-ballots stored: values stored again under a new ballot as the
	// ballot alone (paxos reballot.go).
	Reballots int
}

func (c *Counts) add(o Counts) {
	c.Learners += o.Learners
	c.Reballots += o.Reballots
	c.Promotions += o.Promotions
	c.Joins += o.Joins
	c.Transfers += o.Transfers
	c.TransfersDone += o.TransfersDone
	c.TransfersNow += o.TransfersNow
	c.Crashes += o.Crashes
	c.MidReadyCrashes += o.MidReadyCrashes
	c.TotalCrashes += o.TotalCrashes
	c.Partitions += o.Partitions
	c.OneWays += o.OneWays
	c.ConfChanges += o.ConfChanges
	c.FreshNodes += o.FreshNodes
	c.SnapshotsInstalled += o.SnapshotsInstalled
	c.Compactions += o.Compactions
	c.LeaseOrBarrierReads += o.LeaseOrBarrierReads
	c.Pauses += o.Pauses
	c.OwnWrites += o.OwnWrites
	c.OwnWritesSlow += o.OwnWritesSlow
	c.OwnWritesReordered += o.OwnWritesReordered
	c.OwnWritesSuperseded += o.OwnWritesSuperseded
	c.OwnWritesLost += o.OwnWritesLost
	c.OwnWritesSurvived += o.OwnWritesSurvived
	c.CrashesAfterSend += o.CrashesAfterSend
	c.CrashesInFlight += o.CrashesInFlight
	c.TransfersStarted += o.TransfersStarted
	c.TransfersFailed += o.TransfersFailed
	c.TransfersStale += o.TransfersStale
	c.StagedCrashes += o.StagedCrashes
}

// Failed reports whether the run found a violation.
func (r *Result) Failed() bool { return r.Violations > 0 }

func (r *Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed=%d nodes=%d clients=%d faults=%s ops=%d/%d retries=%d faultEvents=%d commit=%d violations=%d",
		r.Seed, r.Nodes, r.Clients, r.Faults, r.Ops, r.Calls, r.Retries, r.FaultCount, r.Commit, r.Violations)
	for _, m := range r.Messages {
		b.WriteString("\n  violation: ")
		b.WriteString(m)
	}
	return b.String()
}

// simNode is one simulated replica: the paxos node (nil while crashed), its
// durable store, its application state and its clock.
type simNode struct {
	id          paxos.NodeID
	n           *paxos.Node
	store       *durableStore
	app         *kvApp
	incarnation int

	periodMicros int64 // tick period of this node's clock
	nextTickAt   int64
	// startedAt and firstTickAt date this incarnation's clock: its tick k
	// (k >= 1) falls at firstTickAt + (k-1)*periodMicros (global).
	startedAt, firstTickAt int64
	// pausedUntil: while now < pausedUntil the node takes no input (a
	// stopped process); its messages wait in pausedQ, and when it resumes
	// it gets every tick owed first, then the queued messages in order
	// (the runtime's clock contract).
	pausedUntil int64
	pausedQ     []packet
	// leaderCC holds the slots of ConfChanges this incarnation accepted
	// under its own ballot and has not seen committed (membership.go).
	leaderCC  []slotBallot
	downUntil int64 // tick at which a crashed node restarts
	// crashMidReady arms a crash inside the next Ready: after its durable
	// part is recorded and before its messages are sent.
	crashMidReady bool
	// crashAfterSend arms a crash right after the messages of the next
	// Ready with own acceptances went out, before their write completed
	// (ownpersist.go).
	crashAfterSend bool
	// ownWrites are the leader's own writes in flight (ownpersist.go);
	// ownSeq numbers them, ownDone is past the highest completed.
	ownWrites       []*ownWrite
	ownSeq, ownDone uint64
	nextCompact     int64 // tick of the next Compact
	// xfers are the snapshot transfers in flight to this node
	// (transfer.go); lost when it crashes.
	xfers []*transfer
	// join: a fresh node started in Join mode (membership.go).
	join bool

	lastRole   paxos.Role // for the trace only
	lastBallot paxos.Ballot
}

func (sn *simNode) up() bool { return sn.n != nil }

func (sn *simNode) paused() bool { return sn.pausedUntil > 0 }

type sim struct {
	opts   Options
	seed   uint64
	r      *simRand
	now    int64 // micro-ticks
	faults FaultSet

	nodes []*simNode // in id order, so iteration is deterministic
	byID  map[paxos.NodeID]*simNode
	// genesis is the initial membership, which every node's Config gets
	// (a node that joins later replays or snapshots from it).
	genesis []paxos.NodeID
	// members is the membership after slot membersSlot, the highest slot
	// any replica applied.
	members     []paxos.NodeID
	learners    []paxos.NodeID
	membersSlot paxos.Slot
	conf        confChanger
	handOver    *handOver // leadership.go
	net         *network
	chk         *checker
	lease       leaseOracle

	clients     []*client
	history     []porcupine.Operation
	readWaiters map[uint64]readWaiter
	nextReadID  uint64

	appDurableEveryApply bool
	liveness             bool // faults healed; clients only finish what they started
	partitionUntil       int64
	oneWayUntil          int64

	// ownWriteMicros bounds the delay of a leader's own write, and
	// ownSurvive lets writes in flight survive a crash (ownpersist.go);
	// both per seed.
	ownWriteMicros int64
	ownSurvive     bool

	result Result
}

// Run runs the simulation for one seed and returns its result. It never
// panics: a panic in the paxos core is reported as a violation.
func Run(seed uint64, opts Options) (res *Result) {
	s := newSim(seed, opts)
	defer func() {
		if p := recover(); p != nil {
			stack := string(debug.Stack())
			if len(stack) > 3000 {
				stack = stack[:3000]
			}
			s.chk.violate("panic at tick %d: %v\n%s", s.now/microsPerTick, p, stack)
			res = s.finish(false)
		}
	}()
	s.run()
	return s.finish(true)
}

func newSim(seed uint64, opts Options) *sim {
	s := &sim{
		opts:        opts,
		seed:        seed,
		r:           newSimRand(seed),
		byID:        map[paxos.NodeID]*simNode{},
		net:         newNetwork(),
		readWaiters: map[uint64]readWaiter{},
	}
	n := opts.Nodes
	if n == 0 {
		n = 3 + 2*s.r.intn(2)
		if opts.MembershipHeavy {
			n = 4 + s.r.intn(2) // room to remove one and keep three
		}
	}
	nc := opts.Clients
	if nc == 0 {
		nc = 2 + s.r.intn(5)
	}
	s.faults = opts.Faults
	if s.faults == 0 && opts.MembershipHeavy {
		s.faults = FaultMembership | FaultPartition | FaultOneWay | FaultCrash | FaultDrop | FaultDuplicate | FaultReorder
	}
	if s.faults == 0 {
		s.faults = randomFaults(s.r)
	}
	if opts.NoFaults {
		s.faults = 0
	}
	if s.opts.Ticks == 0 {
		s.opts.Ticks = TicksDefault
	}
	s.appDurableEveryApply = s.r.chance(1, 2)
	s.ownWriteMicros = []int64{0, 400, ownWriteMicrosMax, 4 * ownWriteMicrosMax}[s.r.intn(4)]
	s.ownSurvive = s.r.chance(1, 2)
	quorum := n/2 + 1
	if s.faults.Has(FaultMembership) {
		quorum = 0 // majorities shift with membership; rely on the commit checks
	}
	s.chk = newChecker(quorum)
	s.result = Result{Seed: seed, Nodes: n, Clients: nc, Faults: s.faults}

	if s.faults.Has(FaultDrop) {
		s.net.dropPPM = uint32(s.r.between(1, dropPPMMax))
	}
	if s.faults.Has(FaultDuplicate) {
		s.net.dupPPM = uint32(s.r.between(1, dupPPMMax))
	}
	if s.faults.Has(FaultReorder) {
		s.net.longDelayPPM = uint32(s.r.between(1, longDelayPPMMax))
	}
	for i := 1; i <= n; i++ {
		s.genesis = append(s.genesis, paxos.NodeID(i))
	}
	s.chk.q().governs(s.chk, 1, s.genesis) // check_quorum.go
	for _, id := range s.genesis {
		s.addNode(id)
	}
	s.conf.nextFresh = paxos.NodeID(n + 1)
	for i := range nc {
		s.clients = append(s.clients, &client{id: uint32(i + 1), idx: i, leader: s.genesis[s.r.intn(n)]})
	}
	return s
}

// addNode creates the simulated replica id, with an empty store, not yet
// started.
func (s *sim) addNode(id paxos.NodeID) *simNode {
	sn := &simNode{id: id, store: newDurableStore(), periodMicros: microsPerTick}
	if s.faults.Has(FaultDrift) {
		d := s.r.between(-driftPPMMax, driftPPMMax)
		sn.periodMicros = microsPerTick + d*microsPerTick/1_000_000
	}
	sn.nextTickAt = s.now + s.r.between(0, microsPerTick-1)
	sn.nextCompact = s.now/microsPerTick + s.r.between(compactTicksMin, compactTicksMax)
	s.nodes = append(s.nodes, sn)
	s.byID[id] = sn
	return sn
}

func (s *sim) tracef(format string, args ...any) {
	if s.opts.Trace != nil {
		s.opts.Trace(fmt.Sprintf("%6d.%03d ", s.now/microsPerTick, s.now%microsPerTick) + fmt.Sprintf(format, args...))
	}
}

func (s *sim) baseConfig(id paxos.NodeID) paxos.Config {
	return paxos.Config{
		ID:        id,
		ClusterID: clusterID,
		Members:   slices.Clone(s.genesis),
		// The address book: every node the group has had so far, as an
		// operator's config lists the current members when a node
		// (re)starts or joins. Without it a joining node would drop the
		// messages of members that joined after genesis.
		KnownNodes:     s.nodeIDs(),
		ElectionTicks:  electionTicks,
		HeartbeatTicks: heartbeatTicks,
		LeaseTicks:     leaseTicks,
		DriftTicks:     driftTicks,
		Seed:           int64(s.r.u64()),
		// A fresh node of the membership-heavy profile may join without
		// a membership (paxos join.go); Join is ignored once its durable
		// state holds a snapshot.
		Join:             s.byID[id] != nil && s.byID[id].join,
		InflightBytesMax: s.opts.InflightBytesMax,
		PipelineSlotsMax: s.opts.PipelineSlotsMax,
	}
}

// nodeIDs lists every simulated node created so far.
func (s *sim) nodeIDs() []paxos.NodeID {
	ids := make([]paxos.NodeID, len(s.nodes))
	for i, sn := range s.nodes {
		ids[i] = sn.id
	}
	return ids
}

// start (re)creates the node of sn from its durable store.
func (s *sim) start(sn *simNode) {
	var app *kvApp
	var err error
	switch {
	case s.appDurableEveryApply && sn.store.appState != nil:
		app, err = decodeKVApp(sn.store.appState)
	case sn.store.snapData != nil:
		app, err = decodeKVApp(sn.store.snapData)
	default:
		app = newKVApp()
		if !sn.join {
			app.members = slices.Clone(s.genesis) // a joiner knows none
		}
	}
	if err != nil {
		s.chk.violate("node %d: durable application state unreadable: %v", sn.id, err)
		app = newKVApp()
		app.members = slices.Clone(s.genesis)
	}
	app = s.recoverStaged(sn, app)
	st := sn.store.durableState(app.applied)
	n, err := paxos.NewNode(s.baseConfig(sn.id), st)
	if err != nil {
		s.chk.violate("node %d: NewNode failed on restart: %v", sn.id, err)
		return
	}
	sn.n = n
	sn.app = app
	sn.incarnation++
	if s.opts.OnStart != nil {
		s.opts.OnStart(sn.id)
	}
	sn.nextTickAt = s.now + s.r.between(1, sn.periodMicros)
	sn.startedAt, sn.firstTickAt = s.now, sn.nextTickAt
	s.process(sn)
}

func (s *sim) crash(sn *simNode, downTicks int64) {
	s.tracef("node %d: crash (down %d ticks, mid-Ready %v)", sn.id, downTicks, sn.crashMidReady)
	s.result.Counts.Crashes++
	if sn.crashMidReady {
		s.result.Counts.MidReadyCrashes++
	}
	sn.crashMidReady, sn.crashAfterSend = false, false
	s.loseOwnWrites(sn)
	sn.pausedUntil, sn.pausedQ = 0, nil
	sn.xfers = nil
	sn.n = nil
	sn.app = nil
	sn.downUntil = s.now/microsPerTick + downTicks
	s.result.FaultCount++
}

func (s *sim) run() {
	for _, sn := range s.nodes {
		s.start(sn)
	}
	faultEnd := int64(s.opts.Ticks)
	for s.now = 0; ; s.now += stepMicros {
		if s.now%microsPerTick == 0 {
			tick := s.now / microsPerTick
			if tick < faultEnd {
				s.faultStep(tick)
			} else if !s.liveness {
				s.heal()
			}
			s.maintenance(tick)
			s.transferStep(tick)
			if s.faults.Has(FaultMembership) {
				s.confStep(tick)
			}
			s.handOverStep(tick) // leadership.go
			for _, c := range s.clients {
				s.clientStep(c, tick)
			}
			if s.liveness {
				if s.settled() {
					return
				}
				if tick >= faultEnd+LivenessTicksMax {
					s.livenessFailure()
					return
				}
			}
		}
		for _, sn := range s.nodes {
			if sn.paused() {
				if s.now < sn.pausedUntil {
					continue
				}
				sn.pausedUntil = 0 // resumes: owed ticks first, then the queue
			}
			for sn.up() && sn.nextTickAt <= s.now {
				sn.nextTickAt += sn.periodMicros
				sn.n.Tick()
				s.process(sn)
			}
			s.ownWritesDue(sn)
			for len(sn.pausedQ) > 0 && sn.up() {
				p := sn.pausedQ[0]
				sn.pausedQ = sn.pausedQ[1:]
				s.deliver(p)
			}
		}
		for {
			p, ok := s.net.due(s.now)
			if !ok {
				break
			}
			s.deliver(p)
		}
	}
}

func (s *sim) deliver(p packet) {
	sn := s.byID[p.to]
	if sn == nil || !sn.up() {
		return
	}
	if sn.paused() {
		sn.pausedQ = append(sn.pausedQ, p)
		return
	}
	m, err := paxos.UnmarshalMessage(p.data)
	if err != nil {
		s.chk.violate("codec: a message node %d encoded does not decode: %v", p.from, err)
		return
	}
	s.net.stats.delivered++
	if s.opts.OnDeliver != nil {
		s.opts.OnDeliver(&m)
	}
	_ = sn.n.Step(m) // bad messages are counted by the node; nothing to do here
	s.process(sn)
}

func (s *sim) finish(checkHistory bool) *Result {
	if checkHistory {
		if why := checkLinearizable(s.history); why != "" {
			s.chk.violateSafety("%s", why)
		}
	}
	r := s.result
	r.Calls = len(s.history)
	r.Net = s.net.stats
	r.FaultCount += int(s.net.stats.dropped + s.net.stats.duplicated + s.net.stats.delayed + s.net.stats.blocked)
	r.Violations = s.chk.count
	r.SafetyViolations = s.chk.safety
	r.Messages = s.chk.violations
	r.LeaseChecks, r.LeaseViolations = s.lease.checks, s.lease.violations
	r.QuorumChecks, r.QuorumViolations = s.chk.q().checks, s.chk.q().violations
	return &r
}
