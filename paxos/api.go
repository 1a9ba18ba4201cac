package paxos

import "errors"

// This file is the contract between the paxos state machine and everything
// that drives it (the replica runtime in kv/, the simulator in paxossim/, the
// accel plane). Signatures here are relied on by other packages: extend them,
// do not change them without updating every caller.

// NodeID names an acceptor. Zero is never a valid node.
type NodeID uint64

// Slot is a position in the replicated log. Slot 0 is never used; the first
// real slot is 1.
type Slot uint64

// Ballot orders leadership attempts. Ballots compare by Round, then by Node,
// so two proposers never share a ballot. The zero Ballot is lower than every
// ballot a node can create.
type Ballot struct {
	Round uint64
	Node  NodeID
}

// Less reports whether b orders strictly before o.
func (b Ballot) Less(o Ballot) bool {
	if b.Round != o.Round {
		return b.Round < o.Round
	}
	return b.Node < o.Node
}

// IsZero reports whether b is the zero ballot.
func (b Ballot) IsZero() bool { return b == Ballot{} }

// EntryType says what a log entry holds.
type EntryType uint8

const (
	// EntryNormal holds a batch of application commands.
	EntryNormal EntryType = 1
	// EntryNoop fills a hole found during phase 1, or marks a new leader's
	// ballot in the log. It carries no commands.
	EntryNoop EntryType = 2
	// EntryConfChange holds one encoded ConfChange.
	EntryConfChange EntryType = 3
)

// Entry is one slot's value as accepted by an acceptor.
type Entry struct {
	Slot   Slot
	Ballot Ballot // the ballot under which this value was accepted
	Type   EntryType
	// Cmds are the application commands batched into this slot (EntryNormal),
	// or a single encoded ConfChange (EntryConfChange). The state machine
	// never retains them beyond Advance: callers copy what they keep.
	Cmds [][]byte
	// Held, on an entry of Ready.Accepted or Ready.OwnAccepted, is the
	// ballot under which this node already stored the same value at this
	// slot (durably, or earlier in the same Accepted): the caller may
	// store the new ballot alone, naming Held, instead of the commands
	// again (reballot.go). Zero otherwise. Never sent: messages and
	// recovered entries carry none.
	Held Ballot
}

// ConfChangeType is the kind of membership change.
type ConfChangeType uint8

const (
	// ConfAddNode adds a voter.
	ConfAddNode ConfChangeType = 1
	// ConfRemoveNode removes a voter or a learner.
	ConfRemoveNode ConfChangeType = 2
	// ConfAddLearner adds a learner: it receives the log but counts in no
	// quorum and never campaigns (membership.go).
	ConfAddLearner ConfChangeType = 3
	// ConfPromote makes a learner a voter.
	ConfPromote ConfChangeType = 4
)

// ConfChange adds, promotes or removes one member. It is proposed through
// the log (ProposeConfChange) and takes effect by the rule documented on
// ProposeConfChange.
type ConfChange struct {
	Type ConfChangeType
	Node NodeID
	// Context is opaque to the core (at most ConfChangeContextBytesMax
	// bytes): it travels in the entry and comes back with it in
	// Ready.Committed. kv/replica puts the resulting membership there,
	// with every member's addresses.
	Context []byte
}

// ReadState answers a ReadIndex request: once the application has applied
// through Index, a read that started before ReadIndex was called may be
// served locally and is linearizable.
type ReadState struct {
	ID    uint64 // the id passed to ReadIndex
	Index Slot   // the commit index to wait for
	// ByLease says the read point came from the leader's lease (no
	// quorum round); otherwise a read barrier confirmed it.
	ByLease bool
}

// LeaseState is a node's lease bookkeeping, in its own ticks (see "Which
// clock each lease decision uses" in the package doc). It is for checkers
// (the simulators' lease oracle); nothing in the protocol reads it.
type LeaseState struct {
	Now int64 // ticks since NewNode
	// LeaderUntil: as leader, the lease is valid while Now < LeaderUntil
	// (0 when not leading or no lease was ever confirmed).
	LeaderUntil int64
	// As acceptor: until GrantedUntil this node refuses to promise or
	// accept a higher ballot from any node but GrantedTo (GrantedTo 0:
	// from every node, as after a restart).
	GrantedTo    NodeID
	GrantedUntil int64
}

// AckEvent records that the leader counted an Accepted for (Slot, Ballot).
// Count is the number of distinct acceptors (the leader included) that have
// accepted this (Slot, Ballot) so far. Committed is true on the event that
// first reached the quorum. The accel plane's aggregator is checked against
// this stream.
type AckEvent struct {
	Slot      Slot
	Ballot    Ballot
	From      NodeID
	Count     int
	Committed bool
}

// SnapshotMeta describes an application snapshot: the state after applying
// every slot <= Slot, with the membership in force at that point (the one
// that governs the slots above Slot, so a ConfChange at Slot is included).
// The core deals only in this metadata: the application keeps the means to
// serve its state (a snapshot of its store) and moves the bytes itself.
type SnapshotMeta struct {
	Slot    Slot
	Members []NodeID // the voters
	// Learners are the learners of that membership (see membership.go).
	Learners []NodeID
}

// SnapshotOffer tells a node that lags below another's compaction point
// that From holds a snapshot at Meta.Slot (or later) which it can serve.
// It is advice (Ready.SnapshotOffer): the application may fetch the state
// from From, stage it durably, and then call InstallSnapshot with the
// metadata of what it fetched. Dropping an offer is harmless: a node is
// offered again while it lags.
type SnapshotOffer struct {
	From NodeID
	Meta SnapshotMeta
}

// Role is a node's view of its own part in the group.
type Role uint8

const (
	RoleFollower  Role = 1
	RoleCandidate Role = 2 // running phase 1
	RoleLeader    Role = 3
)

func (r Role) String() string {
	switch r {
	case RoleFollower:
		return "follower"
	case RoleCandidate:
		return "candidate"
	case RoleLeader:
		return "leader"
	}
	return "unknown"
}

// Status is a snapshot of a node's state for observers (kvctl status,
// metrics, tests). It is a copy: holding it does not hold the node.
type Status struct {
	ID         NodeID
	Role       Role
	Leader     NodeID // 0 when unknown
	Promised   Ballot // highest ballot promised
	Ballot     Ballot // the ballot this node leads or campaigns with (when it does)
	Commit     Slot
	Applied    Slot     // the highest slot the application reported through Advance
	LastSlot   Slot     // highest slot with an accepted entry here
	FirstSlot  Slot     // lowest slot still held in the log (above the snapshot)
	Members    []NodeID // the voters of the latest membership
	Learners   []NodeID // its learners
	LeaseValid bool
	// LeaseUntil is, on a leader, the tick of this node's clock (the
	// ticks it has been given) before which its lease is valid; 0
	// elsewhere. A caller whose clock maps ticks to time can tell
	// whether the lease has run out since this Status, while the node
	// was not stepped.
	LeaseUntil int64
	Dropped    uint64 // bad messages dropped and counted
	// Transferring is the node leadership is being handed to
	// (TransferLeadership), while the hand-over runs.
	Transferring NodeID
	// OwnUndurable is how many of this leader's own acceptances were
	// handed out (Ready.OwnAccepted) and not yet reported durable
	// (OwnAcceptedDurable): its vote for those slots does not count yet.
	OwnUndurable int
	// ElectionsDeferred counts the elections this node did not start
	// because its entries above the commit index would not fit in the log
	// room the caller declared (SetLogRoom).
	ElectionsDeferred uint64
	// PreCheckRefusals counts the refusals this node's pre-checks received
	// (a member that heard from a leader lately, holds another's lease,
	// or committed further: handlePreCheck).
	PreCheckRefusals uint64
}

// DurableState is what a node recovers from stable storage when it
// restarts: everything the Ready contract made durable, and nothing else.
type DurableState struct {
	Promised Ballot
	// Accepted holds the latest accepted entry for each slot above the
	// snapshot, in slot order. Later writes of the same slot supersede
	// earlier ones; the caller passes only the winner. Those at or below
	// Applied must hold the values applied there, one for every slot
	// between the snapshot and Applied: the node keeps them as committed
	// entries, to serve catch-ups from (a tail kept across restarts).
	Accepted []Entry
	// Snapshot, when non-nil, is the latest snapshot the application holds
	// (its metadata; the application keeps the means to serve the state,
	// so the node offers it to laggards from the start).
	Snapshot *SnapshotMeta
	// Applied is the highest slot already applied to the application state
	// (it is stored with the data, so it survives restarts). Committed
	// entries at or below it are never delivered again.
	Applied Slot
	// Chosen, when above Applied, is a slot through which the caller
	// recorded (durably, before the restart) that every entry in
	// Accepted holds the chosen value: the node's commit index had passed
	// them and they were delivered. The node commits the entries it holds
	// from Applied+1 up to it, stopping at the first slot it lacks, and
	// delivers them in its first Ready, instead of counting them
	// uncommitted (which a leader would re-propose, and which fill its
	// log room). 0: none recorded.
	Chosen Slot
}

// Sentinel errors. Expected conditions are errors; a broken invariant is a
// panic that prints the state.
var (
	ErrNotLeader      = errors.New("paxos: not the leader")
	ErrProposalsFull  = errors.New("paxos: proposal queue full")
	ErrConfChangeBusy = errors.New("paxos: a membership change is already in progress")
	ErrBadMessage     = errors.New("paxos: bad message dropped")
	ErrStopped        = errors.New("paxos: node stopped")
	ErrNotMember      = errors.New("paxos: not a member of the group")
	ErrLeaseHeld      = errors.New("paxos: a lease granted to another leader is still running")
	// ErrNoLogRoom: the entries this node would re-propose as leader do
	// not fit in the log room the caller declared (SetLogRoom).
	ErrNoLogRoom = errors.New("paxos: no acceptor-log room for the entries this node would re-propose as leader")
	// ErrTransferring: the leader is handing leadership over
	// (TransferLeadership) and takes no new proposal or change; the
	// caller retries at the next leader.
	ErrTransferring = errors.New("paxos: leadership is being transferred")
	// ErrSnapshotStale: InstallSnapshot of a snapshot at or below the
	// node's commit index (it moved past it meanwhile); the caller
	// discards what it staged.
	ErrSnapshotStale = errors.New("paxos: snapshot at or below the commit index")
)
