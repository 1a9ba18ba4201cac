package paxos

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
)

// MsgType is the kind of a consensus message.
type MsgType uint8

// Message is one consensus message between acceptors. Outside the package,
// callers only route it (From, To), encode it (AppendMessage) and decode it
// (UnmarshalMessage); its other fields are the protocol's business.
type Message struct {
	Type    MsgType
	Cluster uint64
	From    NodeID
	To      NodeID
	Ballot  Ballot
	// Fields below are owned by the protocol implementation; it may add
	// more. Every field must round-trip through AppendMessage /
	// UnmarshalMessage.
	Slot    Slot
	Commit  Slot
	Entries []Entry

	// Index is a second slot whose meaning depends on Type: the last slot
	// an Accepted acknowledges, the last slot a Promise reports.
	Index Slot
	// Last is the highest slot the sender holds (Promise).
	Last Slot
	// Context is the heartbeat sequence (Heartbeat, HeartbeatResp) or the
	// pre-check round (PreCheck, PreCheckResp).
	Context uint64
	// Reject marks a refusal; Ballot then carries the refusing acceptor's
	// promised ballot.
	Reject bool
	// Joining marks the heartbeat answer of a node started with
	// Config.Join that has no membership yet (join.go): only a snapshot
	// can catch it up.
	Joining bool
	// Snapshot is the metadata of the sender's snapshot (MsgSnapshot
	// only): the state itself never travels in a consensus message.
	Snapshot *SnapshotMeta
}

// Config configures a Node. Times are in ticks: the node has no clock, the
// caller calls Tick at a fixed period.
type Config struct {
	ID        NodeID
	ClusterID uint64
	// Members is the initial membership, used only when DurableState holds
	// no snapshot (a fresh group). Every member must be given the same list.
	Members []NodeID
	// KnownNodes are further nodes whose messages are accepted before the
	// log names them. A node joining a running group passes the group's
	// current membership here (it still starts from Members, or a snapshot,
	// and learns the real history from the log): otherwise it would drop
	// messages from members added after the initial membership.
	KnownNodes []NodeID

	ElectionTicks  int // base election timeout; randomized in [ElectionTicks, 2*ElectionTicks)
	HeartbeatTicks int // leader heartbeat period
	LeaseTicks     int // lease an acceptor grants on each heartbeat ack
	DriftTicks     int // clock-drift bound subtracted from the lease on the leader side

	// Seed makes the randomized election timeouts deterministic.
	Seed int64

	// Join starts a node that is not in the membership yet and knows
	// nothing of it (join.go): it ignores Members, stores and commits
	// nothing until it installs a snapshot, and never campaigns before.
	// Without a snapshot in DurableState a joining node must be started
	// with Join every time, until it has installed one.
	Join bool

	// ExternalElection, when true, stops Tick from ever starting an
	// election: an outside timer (the accel plane's heartbeat engine) calls
	// Campaign instead, and reports heartbeats it handled through
	// NoteLeaderContact. Leader heartbeats and check quorum still run on
	// Tick.
	ExternalElection bool

	// InflightBytesMax, when > 0, bounds the encoded bytes of the entries
	// a leader holds above its commit index (the values it re-proposed
	// after phase 1 and those it assigned since): it assigns a new slot
	// only while they stay below the bound, so the window exceeds it by
	// at most one entry. The caller derives it from its acceptor log, so
	// that a node's uncommitted entries always fit in the log room a
	// follower keeps free (kv/replica accept_admission.go): a successor
	// re-proposing them never finds its log full. 0 leaves the window to
	// inflightSlotsMax alone.
	InflightBytesMax int

	// PipelineSlotsMax, when > 0, is the leader's pipeline window for
	// slots that are not full: it assigns a slot of fewer than
	// SlotCmdsMax commands and SlotBytesMax bytes only while fewer than
	// PipelineSlotsMax slots above its commit index wait, and proposals
	// made meanwhile join it in its queue; a full slot goes out at once,
	// within inflightSlotsMax. 0: no such window; more than
	// inflightSlotsMax is an error. It costs nothing at low load (a
	// proposal with the window open gets a slot at once) and batches
	// under load: with no window, a leader fed faster than one proposal
	// per loop turn but below its capacity gave nearly every command a
	// slot of its own, and each slot costs an Accept and a persist on
	// every follower (kv/replica pipelineSlotsMax says what was measured).
	// Full slots are not held because they gain nothing by waiting: with
	// values that each fill a slot, a window on every slot capped the
	// pipeline at that many values (256 KiB values: a third less
	// throughput at 2). Slots a new leader re-proposes after phase 1 are
	// assigned whatever the window; new proposals that do not fill a slot
	// wait until enough of them commit.
	PipelineSlotsMax int

	// RecordOverheadBytes is the ring space a persisted entry takes beyond
	// its encoding (the caller's record header and alignment). It is used
	// only to judge SetLogRoom.
	RecordOverheadBytes int
}

// Ready carries everything the caller must do after the node changed:
// persist, then send, then apply. See the contract on Node.
type Ready struct {
	// Promised is non-nil when the promised ballot rose; it must be durable
	// before Messages are sent.
	Promised *Ballot
	// Accepted are entries this node accepted as an acceptor (of another
	// node's ballot, on catch-up, or its own when it stopped leading before
	// handing them out); they must be durable before Messages are sent.
	Accepted []Entry
	// OwnAccepted are this leader's own acceptances of the values it
	// proposes, all under its ballot, in contiguous increasing slots. They
	// must be made durable, but Messages need not wait: the caller persists
	// them in parallel with sending and then reports them with
	// OwnAcceptedDurable (see the contract on Node). They must not become
	// durable before Promised.
	OwnAccepted []Entry
	// Messages go out after Promised and Accepted are durable.
	Messages []Message
	// Snapshot, when non-nil, names the snapshot InstallSnapshot accepted:
	// the application swaps in the state it staged for it before
	// Committed is applied.
	Snapshot *SnapshotMeta
	// SnapshotOffer, when non-nil, is a peer's offer of a snapshot this
	// node lags below (see SnapshotOffer): advice, not an obligation.
	SnapshotOffer *SnapshotOffer
	// Committed entries are delivered in slot order, each exactly once.
	Committed []Entry
	// ReadStates answer ReadIndex calls.
	ReadStates []ReadState
	// AckEvents are the leader's Accepted counts (see AckEvent).
	AckEvents []AckEvent
}

// Node is a Multi-Paxos replica as a pure state machine in the shape of
// etcd's RawNode: no goroutines, clocks or I/O.
//
// The Ready contract: after Ready returns rd, the caller must, in order,
//  1. make rd.Promised and rd.Accepted durable (an acceptor may only answer
//     Promise or Accepted once what it promised or accepted survives a
//     crash),
//  2. send rd.Messages,
//  3. install rd.Snapshot (swap in the state staged for it) and apply
//     rd.Committed in slot order,
//  4. call Advance(rd);
//
// and, not in that order but in parallel with steps 2-4 and later Readys,
//  5. make rd.OwnAccepted durable, then call OwnAcceptedDurable for them
//     (the leader's vote counts only from then on: ownvote.go).
//
// Durable writes keep Ready order per slot: an entry handed out in
// Accepted or OwnAccepted supersedes every entry for its slot handed out
// earlier (OwnAccepted after Accepted within one Ready), whatever order the
// writes complete in; one append-only log written in Ready order does
// this. A committed slot is delivered only once this node holds its value
// durably: a slot held only in a not yet reported OwnAccepted waits, and so
// does every slot after it.
//
// Snapshots move outside the core: a lagging node's Ready carries
// SnapshotOffer; the application fetches the state from the offering peer
// (which serves it from its own store), stages it durably, and only then
// calls InstallSnapshot, whose Ready carries Snapshot.
//
// Each Ready must be followed by its Advance before the next Ready. Ready
// hands over the pending output: a Ready that is dropped without being
// handled loses messages (harmless: they are retransmitted) but the caller
// must never skip step 1 for a Ready whose messages it sends.
//
// Committed entries are delivered exactly once across the life of the node
// and in slot order (a restart resumes after DurableState.Applied). Noop and
// ConfChange entries are delivered too, so slots stay contiguous.
//
// Ownership: Propose and Step take ownership of the byte slices they are
// given (the node keeps them in its log); slices in a Ready stay valid and
// unmodified, but the caller copies what it keeps beyond Advance.
//
// A node is not safe for concurrent use.
type Node struct {
	cfg Config
	id  NodeID
	rng *rand.Rand

	now int64 // ticks since NewNode

	role   Role
	leader NodeID // 0 when unknown
	// Invariant: promised >= every ballot this node accepted under.
	promised Ballot
	// maxRound is the highest round seen in any ballot, so a new campaign
	// outbids every ballot it heard of, not just the one it promised.
	maxRound uint64

	log acceptorLog
	// Invariant: log.first-1 <= applied <= delivered <= commit, and every
	// slot in [log.first, commit] holds the chosen value.
	commit    Slot
	delivered Slot // committed entries handed out by Ready through here (<= deliverable())
	applied   Slot // reported by Advance

	snap        *SnapshotMeta    // latest local snapshot (the application serves its state)
	snapOffered map[NodeID]int64 // when offerSnapshot last sent to a node (bounded by known)
	pendingSnap *SnapshotMeta    // accepted by InstallSnapshot, to hand out in Ready
	snapOffer   *SnapshotOffer   // the newest offer of a snapshot above commit, to hand out in Ready

	conf  confHistory
	known map[NodeID]bool // every node named by any membership seen

	// Election state (all roles).
	electionElapsed int
	electionTimeout int
	precheckRound   uint64
	precheckGrants  map[NodeID]bool
	prechecking     bool
	lastLeaderTick  int64 // when a leader last reached this node

	// Acceptor-side lease: while now < leaseUntil this node promises and
	// accepts higher ballots only from leaseHolder (0: from nobody).
	leaseHolder NodeID
	leaseUntil  int64

	cand *candidate    // non-nil while role == RoleCandidate
	lead *leader       // non-nil while role == RoleLeader
	xfer transferState // leadership hand-over (transfer.go)
	// joining: started with Config.Join and no snapshot installed yet;
	// joiners: the nodes whose last heartbeat answer said they are
	// joining (join.go).
	joining bool
	joiners map[NodeID]bool

	// Pending output, handed over by Ready.
	msgs          []Message
	accepted      []Entry
	ownAccepted   []Entry // this leader's own acceptances (ownvote.go)
	promisedDirty bool
	readStates    []ReadState
	ackEvents     []AckEvent

	// unstable holds the own acceptances handed out (or about to be) in
	// Ready.OwnAccepted and not yet reported durable, by slot: they count
	// for nothing and hold back delivery (ownvote.go). At most
	// ownUnstableSlotsMax entries, plus stale ones below a snapshot until
	// their report comes.
	unstable map[Slot]Ballot

	dropped uint64
	// logRoom is the acceptor-log room the caller declared (SetLogRoom);
	// negative: none declared, no limit. electionsDeferred counts the
	// elections it held back (logroom.go).
	logRoom           int64
	electionsDeferred uint64
	deferringSince    int64 // tick of the first deferral since a leader was heard (-1: none)
	precheckRefusals  uint64
	// heard is when a valid message from each sender last arrived (for
	// observers only: PeerProgress, progress.go; at most heardNodesMax).
	heard map[NodeID]int64
}

// Defaults applied to zero Config fields.
const (
	defaultElectionTicks  = 10
	defaultHeartbeatTicks = 1
)

// NewNode creates a node from its configuration and the state it recovered
// from stable storage (the zero DurableState for a fresh node).
//
// A node joining an existing group (after ConfAddNode) is started with the
// group's initial Members, or from a snapshot; it learns later memberships
// from the log and does not campaign until it sees itself a member.
func NewNode(cfg Config, st DurableState) (*Node, error) {
	if cfg.ID == 0 {
		return nil, errors.New("paxos: config: ID must be non-zero")
	}
	if cfg.ElectionTicks == 0 {
		cfg.ElectionTicks = defaultElectionTicks
	}
	if cfg.HeartbeatTicks == 0 {
		cfg.HeartbeatTicks = defaultHeartbeatTicks
	}
	switch {
	case cfg.ElectionTicks < 2:
		return nil, fmt.Errorf("paxos: config: ElectionTicks %d < 2", cfg.ElectionTicks)
	case cfg.HeartbeatTicks < 1 || cfg.HeartbeatTicks >= cfg.ElectionTicks:
		return nil, fmt.Errorf("paxos: config: HeartbeatTicks %d must be in [1, ElectionTicks)", cfg.HeartbeatTicks)
	case cfg.LeaseTicks < 0 || cfg.LeaseTicks > cfg.ElectionTicks:
		return nil, fmt.Errorf("paxos: config: LeaseTicks %d must be in [0, ElectionTicks]", cfg.LeaseTicks)
	case cfg.DriftTicks < 0 || (cfg.LeaseTicks > 0 && cfg.DriftTicks >= cfg.LeaseTicks):
		return nil, fmt.Errorf("paxos: config: DriftTicks %d must be in [0, LeaseTicks)", cfg.DriftTicks)
	case cfg.PipelineSlotsMax < 0 || cfg.PipelineSlotsMax > inflightSlotsMax:
		return nil, fmt.Errorf("paxos: config: PipelineSlotsMax %d must be in [0, %d]", cfg.PipelineSlotsMax, inflightSlotsMax)
	}
	n := &Node{
		cfg:            cfg,
		id:             cfg.ID,
		rng:            rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(cfg.ID))),
		role:           RoleFollower,
		known:          map[NodeID]bool{},
		logRoom:        -1,
		deferringSince: -1,
	}
	n.promised = st.Promised
	n.maxRound = st.Promised.Round
	first := Slot(1)
	if st.Snapshot != nil {
		if len(st.Snapshot.Members) == 0 {
			return nil, errors.New("paxos: durable state: snapshot without members")
		}
		first = st.Snapshot.Slot + 1
		n.conf.resetWith(first, st.Snapshot.Members, st.Snapshot.Learners)
		m := cloneSnapshotMeta(*st.Snapshot)
		n.snap = &m
	} else if cfg.Join {
		n.joining = true
		n.conf.reset(1, nil)
	} else {
		if len(cfg.Members) == 0 || len(cfg.Members) > MembersMax {
			return nil, fmt.Errorf("paxos: config: %d members, want 1..%d", len(cfg.Members), MembersMax)
		}
		for _, id := range cfg.Members {
			if id == 0 {
				return nil, errors.New("paxos: config: member 0")
			}
		}
		n.conf.reset(1, cfg.Members)
	}
	// Every node ever named is a known sender: the initial members, the
	// snapshot's members and (below) those named by ConfChange entries.
	for _, id := range n.conf.latest() {
		n.known[id] = true
	}
	for _, id := range slices.Concat(cfg.Members, cfg.KnownNodes) {
		if id != 0 {
			n.known[id] = true
		}
	}
	n.log.first = first
	n.commit = max(first-1, st.Applied)
	n.applied = n.commit
	n.delivered = n.commit
	for _, e := range st.Accepted {
		if e.Slot < first {
			continue
		}
		if e.Type < EntryNormal || e.Type > EntryConfChange {
			return nil, fmt.Errorf("paxos: durable state: entry at slot %d has type %d", e.Slot, e.Type)
		}
		if st.Promised.Less(e.Ballot) {
			return nil, fmt.Errorf("paxos: durable state: entry at slot %d accepted under %v above promised %v", e.Slot, e.Ballot, st.Promised)
		}
		n.log.set(e)
		n.noteKnown(&e)
	}
	// Replay the membership changes already applied.
	for s := first; s <= n.commit; s++ {
		e := n.log.get(s)
		if e == nil {
			return nil, fmt.Errorf("paxos: durable state: applied slot %d has no entry", s)
		}
		n.commitConf(e)
	}
	// Commit what was known chosen before the restart, as far as it is
	// held; it is delivered in the first Ready.
	for n.commit < st.Chosen && n.log.get(n.commit+1) != nil && !TestingIgnoreChosen {
		n.advanceCommit()
	}
	// The lease promises of the previous life were not durable: refuse
	// every new ballot for one lease period, so a lease granted just before
	// a crash is still honoured.
	if cfg.LeaseTicks > 0 && !TestingNoRestartRefusal {
		n.leaseHolder, n.leaseUntil = 0, int64(cfg.LeaseTicks)
	}
	n.resetElectionTimer()
	return n, nil
}

// AddKnown adds id to the nodes whose messages this node accepts (its
// address book: Config.Members and KnownNodes, and every node a
// ConfChange it holds names). A runtime calls it when its peer table
// learns of a node about to join, so that a member that has not yet seen
// the ConfChange adding id does not drop id's messages (id may be the
// next leader). Unbounded growth is bounded by MembersMax-sized peer
// tables in the caller; id 0 is ignored.
func (n *Node) AddKnown(id NodeID) {
	if id != 0 {
		n.known[id] = true
	}
}

// noteKnown remembers the nodes a ConfChange entry names, so their
// messages are not dropped as coming from an unknown sender.
func (n *Node) noteKnown(e *Entry) {
	if cc, ok := entryConfChange(e); ok {
		n.known[cc.Node] = true
	}
}

// Tick advances the node's logical clock by one tick: Elapse(1).
func (n *Node) Tick() { n.Elapse(1) }

// Elapse advances the clock by k ticks at once, as a runtime does when its
// loop was stalled (k ticks are owed). Elapse(1) is Tick.
//
// Two kinds of time, on purpose:
//
//   - The clock, and with it every lease decision, moves by all k ticks:
//     leases are safety and must follow real time (see "Which clock each
//     lease decision uses" in the package doc).
//   - The liveness timers (the election countdown, the leader's
//     check-quorum window, a hand-over's resends) count at most
//     LivenessTicksPerElapseMax(cfg) of the k. A node that did not run for
//     k ticks has no evidence that its peers went silent: their messages
//     are waiting in its queue, unstepped. Its timers resume where they
//     were, and the node judges its peers only after it has run long
//     enough to step what they sent. (A check-quorum that judged the
//     stretch itself made a leader whose loop stalled ~100 ms under a
//     GC-heavy scan flood step down although both followers were acking:
//     an election storm on a healthy cluster.) The heartbeat timer fires
//     at most once for the stretch, at once: followers need to hear from a
//     resumed leader soon.
//
// Timers still fire under constant starvation: each Elapse advances them
// by at least one tick, so a loop that runs at all times out a dead peer,
// later by at most the ratio of its gap to the cap.
func (n *Node) Elapse(k int) {
	if k <= 0 {
		return
	}
	n.now += int64(k)
	lk := min(k, LivenessTicksPerElapseMax(n.cfg))
	switch n.role {
	case RoleLeader:
		n.tickLeader(k, lk)
	default:
		n.tickElection(lk)
	}
	n.tickTransfer(lk)
}

// LivenessTicksPerElapseMax is how many ticks of one Elapse the liveness
// timers count: half a heartbeat period (at least one), so the routine
// gaps of a busy loop (a few ticks) count in full and a stall counts as a
// fraction of the heartbeat period.
func LivenessTicksPerElapseMax(cfg Config) int { return max(1, cfg.HeartbeatTicks/2) }

// Campaign starts an election now: the pre-check round, then phase 1 if a
// majority agrees. It is how an outside election timer (ExternalElection)
// drives the node; it works without it too. It returns nil on a leader (no
// change), ErrNotMember when the node is not in the membership,
// ErrNoLogRoom while its re-proposals would not fit in the log room
// declared (SetLogRoom), and ErrLeaseHeld while a lease this node granted
// to another leader runs.
func (n *Node) Campaign() error {
	switch {
	case n.role == RoleLeader:
		return nil
	case !n.isVoter():
		return ErrNotMember
	case !n.roomToLead():
		return ErrNoLogRoom
	case n.leaseBlocks(n.id):
		return ErrLeaseHeld
	}
	n.resetElectionTimer()
	n.startPreCheck()
	return nil
}

// NoteLeaderContact tells the node that a heartbeat from the leader of its
// promised ballot was handled outside it (by the accel plane, which acked
// it). The node counts that as hearing from the leader, and honours the
// lease the ack granted: it refuses other ballots for LeaseTicks. Contact
// from any node but the promised ballot's is ignored.
func (n *Node) NoteLeaderContact(from NodeID) {
	if from == 0 || from == n.id || from != n.promised.Node || n.role == RoleLeader {
		return
	}
	n.followLeader(from)
	if n.cfg.LeaseTicks > 0 {
		n.leaseHolder = from
		n.leaseUntil = n.now + int64(n.cfg.LeaseTicks)
	}
}

// Step feeds one received message to the node. A message with a foreign
// cluster id, an unknown sender or an impossible slot or ballot is dropped,
// counted in Status().Dropped, and reported as an error wrapping
// ErrBadMessage; it never panics.
func (n *Node) Step(m Message) error {
	if err := n.validate(&m); err != nil {
		n.dropped++
		return fmt.Errorf("%w: %s from %d: %v", ErrBadMessage, m.Type, m.From, err)
	}
	if m.Ballot.Round > n.maxRound {
		n.maxRound = m.Ballot.Round
	}
	n.noteHeard(m.From)
	switch m.Type {
	case MsgPreCheck:
		n.handlePreCheck(&m)
	case MsgPreCheckResp:
		n.handlePreCheckResp(&m)
	case MsgPrepare:
		n.handlePrepare(&m)
	case MsgPromise:
		n.handlePromise(&m)
	case MsgAccept:
		n.handleAccept(&m)
	case MsgAccepted:
		n.handleAccepted(&m)
	case MsgHeartbeat:
		n.handleHeartbeat(&m)
	case MsgHeartbeatResp:
		n.noteJoining(&m) // join.go
		n.handleHeartbeatResp(&m)
	case MsgCatchup:
		n.handleCatchup(&m)
	case MsgSnapshot:
		n.handleSnapshot(&m)
	case MsgTransfer:
		n.handleTransfer(&m)
	}
	return nil
}

// Propose submits application commands. On the leader they are batched into
// slots; elsewhere it returns ErrNotLeader. At most ProposalQueueMax
// commands wait for a slot; beyond that it returns ErrProposalsFull.
//
// A nil error means queued, not committed: commands still queued or in
// flight when the node stops leading may be lost or may commit later under
// another leader. Callers learn the outcome from Ready.Committed and retry
// (idempotently) on timeout.
func (n *Node) Propose(cmds [][]byte) error {
	if n.role != RoleLeader {
		return ErrNotLeader
	}
	if n.transferring() {
		return ErrTransferring
	}
	return n.lead.enqueue(cmds)
}

// ConfChangePending reports whether this node leads with a membership
// change queued or proposed and not yet committed: the change
// ProposeConfChange would answer ErrConfChangeBusy for. False on a node
// that does not lead.
func (n *Node) ConfChangePending() bool {
	return n.role == RoleLeader && n.lead.confChangeInFlight()
}

// ProposeConfChange proposes a membership change through the log.
//
// The rule: one change at a time, and a change stops the pipeline. The
// leader puts the ConfChange alone in slot s and assigns no slot above s
// until s is committed; the new membership governs every slot > s, the old
// one every slot <= s (s itself included). While a change is queued or
// uncommitted, another returns ErrConfChangeBusy.
//
// Why it is safe under concurrent failures:
//   - Each change adds or removes one acceptor, so every majority of the old
//     membership intersects every majority of the new one.
//   - No leader sends an Accept for a slot above an uncommitted ConfChange,
//     so every value accepted at a slot > s was proposed by a leader that
//     knew s was chosen, and used the membership s decides.
//   - A candidate runs phase 1 from its commit index upward under the
//     membership at that point, adopts values (highest ballot per slot, a
//     promiser's committed entries outright), and for every ConfChange among
//     the adopted values also needs promises from a majority of the
//     membership it produces, repeating until no new membership appears.
//     Hence for every slot it will propose in, it holds promises from a
//     majority of the membership governing that slot (decided either by
//     committed entries or by the values it will re-propose before it goes
//     past them), which is exactly what single-decree Paxos needs per slot.
//   - A value chosen in slot t under membership M at ballot b < B was
//     accepted by a majority of M; the candidate's promises from a majority of
//     M include one of those acceptors, which reports ballot >= b for t.
func (n *Node) ProposeConfChange(cc ConfChange) error {
	if n.role != RoleLeader {
		return ErrNotLeader
	}
	if n.transferring() {
		return ErrTransferring
	}
	return n.lead.enqueueConfChange(n, cc)
}

// ReadIndex asks for a linearizable read point, answered in a later Ready's
// ReadStates with the same id. Only the leader answers (ErrNotLeader
// elsewhere). With a valid lease, and once the leader's first entry under its
// own ballot is committed, the answer is immediate: Index is the commit
// index. Otherwise the read waits for a read barrier: one heartbeat round
// confirmed by a majority. A read still waiting when the node stops leading
// is never answered; callers time out and retry. At most ReadsPendingMax
// reads wait (ErrReadsFull beyond).
func (n *Node) ReadIndex(id uint64) error {
	if n.role != RoleLeader {
		return ErrNotLeader
	}
	return n.readIndex(id)
}

// Compact tells the node that the application holds a snapshot through
// slot (or can serve one at slot or later), so the log below it may be
// truncated and the snapshot offered to lagging acceptors. slot must not
// exceed the applied slot. The node records only the metadata and
// truncates every slot <= slot: O(1) in the size of the state.
func (n *Node) Compact(slot Slot) error {
	if slot > n.applied {
		return fmt.Errorf("paxos: compact through slot %d beyond applied %d", slot, n.applied)
	}
	if n.snap != nil && slot < n.snap.Slot {
		return fmt.Errorf("paxos: compact through slot %d below snapshot %d", slot, n.snap.Slot)
	}
	if slot == 0 {
		return errors.New("paxos: compact through slot 0")
	}
	meta := n.metaAt(slot)
	n.snap = &meta
	n.log.truncateBelow(slot + 1)
	n.conf.prune(slot + 1)
	return nil
}

// SnapshotMetaAt returns the metadata of a snapshot of the application
// state after slot: the membership in force for the slots above it. A
// node serving its state to a laggard stamps the stream with it. slot must
// lie in [FirstSlot-1, Commit] (below, the membership history was pruned;
// above, it is not final), and not be 0.
func (n *Node) SnapshotMetaAt(slot Slot) (SnapshotMeta, error) {
	if slot == 0 || slot+1 < n.log.first || slot > n.commit {
		return SnapshotMeta{}, fmt.Errorf("paxos: no snapshot metadata for slot %d outside [%d, %d]", slot, n.log.first-1, n.commit)
	}
	return n.metaAt(slot), nil
}

// metaAt is the metadata of a snapshot after slot (slot+1 >= log.first):
// the state after applying slot governs the slots above it, so it carries
// the membership in force there.
func (n *Node) metaAt(slot Slot) SnapshotMeta {
	return SnapshotMeta{Slot: slot, Members: slices.Clone(n.conf.at(slot + 1)), Learners: slices.Clone(n.conf.learnersAt(slot + 1))}
}

// InstallSnapshot tells the node that the application staged, durably and
// verified, the state after meta.Slot (fetched after a SnapshotOffer, with
// the metadata the serving peer stamped on it). When meta.Slot is above the
// commit index the node starts over from it: the log below it goes, the
// commit index and the membership are reset, and the next Ready carries
// Snapshot = meta, which the application must install before any later
// committed entry. At or below the commit index it returns
// ErrSnapshotStale and changes nothing (the transfer arrived late or was
// superseded; the application discards what it staged). Like Step, it is an
// input: never between a Ready and its Advance.
//
// It is safe whoever served the state: a snapshot holds only chosen
// values, and every slot at or below meta.Slot is chosen.
func (n *Node) InstallSnapshot(meta SnapshotMeta) error {
	if err := validSnapshotMeta(&meta); err != nil {
		return err
	}
	stale := meta.Slot <= n.commit
	if TestingInstallStaleSnapshot {
		// The planted bug: compare with where the log starts, not with
		// the commit index.
		stale = meta.Slot+1 <= n.log.first
	}
	if stale {
		return ErrSnapshotStale
	}
	if n.role != RoleFollower {
		// Phase 1 or 2 state is relative to the old commit index;
		// start over from the snapshot.
		n.becomeFollower()
	}
	m := cloneSnapshotMeta(meta)
	n.log.truncateBelow(m.Slot + 1)
	n.commit = m.Slot
	n.delivered = m.Slot
	n.conf.resetWith(m.Slot+1, m.Members, m.Learners)
	for _, id := range slices.Concat(m.Members, m.Learners) {
		n.known[id] = true
	}
	n.joining = false // a joining node has its membership now (join.go)
	n.snap = &m
	n.pendingSnap = &m
	if n.snapOffer != nil && n.snapOffer.Meta.Slot <= m.Slot {
		n.snapOffer = nil
	}
	return nil
}

// HasReady reports whether Ready would return anything.
func (n *Node) HasReady() bool {
	n.flush()
	return n.promisedDirty || len(n.accepted) > 0 || len(n.ownAccepted) > 0 || len(n.msgs) > 0 || n.pendingSnap != nil ||
		n.snapOffer != nil || n.delivered < n.deliverable() || len(n.readStates) > 0 || len(n.ackEvents) > 0
}

// Ready returns what the caller must persist, send and apply, and hands the
// pending output over to the caller.
func (n *Node) Ready() Ready {
	n.flush()
	var rd Ready
	if n.promisedDirty {
		b := n.promised
		rd.Promised = &b
		n.promisedDirty = false
	}
	rd.Accepted, n.accepted = n.accepted, nil
	rd.OwnAccepted, n.ownAccepted = n.ownAccepted, nil
	rd.Messages, n.msgs = n.msgs, nil
	rd.Snapshot, n.pendingSnap = n.pendingSnap, nil
	rd.SnapshotOffer, n.snapOffer = n.snapOffer, nil
	if through := n.deliverable(); n.delivered < through {
		rd.Committed = make([]Entry, 0, through-n.delivered)
		for s := n.delivered + 1; s <= through; s++ {
			e := n.log.get(s)
			if e == nil {
				n.invariantf("committed slot %d has no entry", s)
			}
			rd.Committed = append(rd.Committed, *e)
		}
		n.delivered = through
	}
	rd.ReadStates, n.readStates = n.readStates, nil
	rd.AckEvents, n.ackEvents = n.ackEvents, nil
	return rd
}

// Advance acknowledges that rd was handled as the contract says.
func (n *Node) Advance(rd Ready) {
	if rd.Snapshot != nil && rd.Snapshot.Slot > n.applied {
		n.applied = rd.Snapshot.Slot
	}
	if k := len(rd.Committed); k > 0 {
		if s := rd.Committed[k-1].Slot; s > n.applied {
			n.applied = s
		}
	}
	if n.applied > n.delivered {
		n.invariantf("applied %d beyond delivered %d", n.applied, n.delivered)
	}
}

// LeaseState returns the node's lease bookkeeping (for checkers).
func (n *Node) LeaseState() LeaseState {
	ls := LeaseState{Now: n.now, GrantedTo: n.leaseHolder, GrantedUntil: n.leaseUntil}
	if n.role == RoleLeader {
		ls.LeaderUntil = n.lead.leaseUntil
	}
	return ls
}

// Status returns a copy of the node's state.
func (n *Node) Status() Status {
	st := Status{
		ID:        n.id,
		Role:      n.role,
		Leader:    n.leader,
		Promised:  n.promised,
		Commit:    n.commit,
		Applied:   n.applied,
		LastSlot:  n.log.last(),
		FirstSlot: n.log.first,
		Members:   slices.Clone(n.conf.latest()),
		Learners:  slices.Clone(n.conf.latestLearners()),
		Dropped:   n.dropped,

		ElectionsDeferred: n.electionsDeferred,
		PreCheckRefusals:  n.precheckRefusals,
	}
	if n.role == RoleLeader {
		st.Ballot = n.lead.ballot
		st.LeaseValid = n.leaseValid()
		if n.cfg.LeaseTicks > 0 {
			st.LeaseUntil = n.lead.leaseUntil
		}
		if n.transferring() {
			st.Transferring = n.xfer.to
		}
		st.OwnUndurable = len(n.unstable)
	} else if n.role == RoleCandidate {
		st.Ballot = n.cand.ballot
	}
	return st
}

// AckCount returns the leader's count of distinct acceptors (itself
// included) that accepted slot under ballot, for slots still tracked (the
// pipeline window and recently committed slots). It returns the zero ballot
// and 0 elsewhere and on non-leaders.
func (n *Node) AckCount(slot Slot) (ballot Ballot, count int) {
	if n.role != RoleLeader {
		return Ballot{}, 0
	}
	a := n.lead.acks[slot]
	if a == nil {
		return Ballot{}, 0
	}
	return n.lead.ballot, len(a.from)
}

// send queues m for the next Ready, stamping cluster and sender.
func (n *Node) send(m Message) {
	m.Cluster = n.cfg.ClusterID
	m.From = n.id
	m.Joining = n.joining && m.Type == MsgHeartbeatResp // join.go
	n.msgs = append(n.msgs, m)
}

// invariantf panics with the node's state: a broken invariant is a bug,
// never an expected condition.
func (n *Node) invariantf(format string, args ...any) {
	panicf("paxos: invariant broken on node %d: %s\nstate: %s", n.id, fmt.Sprintf(format, args...), n.describe())
}

func (n *Node) describe() string {
	return fmt.Sprintf("role=%s leader=%d promised=%v commit=%d delivered=%d applied=%d first=%d last=%d members=%v now=%d",
		n.role, n.leader, n.promised, n.commit, n.delivered, n.applied, n.log.first, n.log.last(), n.conf.latest(), n.now)
}

func panicf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
