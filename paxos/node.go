package paxos

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
}

// Config configures a Node. Times are in ticks: the node has no clock, the
// caller calls Tick at a fixed period.
type Config struct {
	ID        NodeID
	ClusterID uint64
	// Members is the initial membership, used only when DurableState holds
	// no snapshot (a fresh group). Every member must be given the same list.
	Members []NodeID

	ElectionTicks  int // base election timeout; randomized in [ElectionTicks, 2*ElectionTicks)
	HeartbeatTicks int // leader heartbeat period
	LeaseTicks     int // lease an acceptor grants on each heartbeat ack
	DriftTicks     int // clock-drift bound subtracted from the lease on the leader side

	// Seed makes the randomized election timeouts deterministic.
	Seed int64
}

// Ready carries everything the caller must do after the node changed:
// persist, then send, then apply. See the contract on Node.
type Ready struct {
	// Promised is non-nil when the promised ballot rose; it must be durable
	// before Messages are sent.
	Promised *Ballot
	// Accepted are entries this node accepted; they must be durable before
	// Messages are sent. A later entry for the same slot supersedes an
	// earlier one.
	Accepted []Entry
	// Messages go out after Promised and Accepted are durable.
	Messages []Message
	// Snapshot, when non-nil, must be installed into the application
	// before Committed is applied.
	Snapshot *Snapshot
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
//  3. install rd.Snapshot and apply rd.Committed in slot order,
//  4. call Advance(rd).
//
// Committed entries are delivered exactly once across the life of the node
// and in slot order.
type Node struct {
	cfg Config
}

// NewNode creates a node from its configuration and the state it recovered
// from stable storage (the zero DurableState for a fresh node).
func NewNode(cfg Config, st DurableState) (*Node, error) {
	panic("paxos: NewNode not implemented yet")
}

// Tick advances the node's logical clock by one tick.
func (n *Node) Tick() { panic("unimplemented") }

// Step feeds one received message to the node. A message with a foreign
// cluster id, an unknown sender or an impossible slot or ballot is dropped,
// counted in Status().Dropped, and reported as an error wrapping
// ErrBadMessage; it never panics.
func (n *Node) Step(m Message) error { panic("unimplemented") }

// Propose submits application commands. On the leader they are batched into
// slots; elsewhere it returns ErrNotLeader.
func (n *Node) Propose(cmds [][]byte) error { panic("unimplemented") }

// ProposeConfChange proposes a membership change through the log.
func (n *Node) ProposeConfChange(cc ConfChange) error { panic("unimplemented") }

// ReadIndex asks for a linearizable read point, answered in a later Ready's
// ReadStates with the same id.
func (n *Node) ReadIndex(id uint64) error { panic("unimplemented") }

// Compact tells the node that the application holds a snapshot through
// slot, so the log below it may be truncated and the snapshot sent to
// lagging acceptors.
func (n *Node) Compact(slot Slot, data []byte) error { panic("unimplemented") }

// HasReady reports whether Ready would return anything.
func (n *Node) HasReady() bool { panic("unimplemented") }

// Ready returns what the caller must persist, send and apply.
func (n *Node) Ready() Ready { panic("unimplemented") }

// Advance acknowledges that rd was handled as the contract says.
func (n *Node) Advance(rd Ready) { panic("unimplemented") }

// Status returns a copy of the node's state.
func (n *Node) Status() Status { panic("unimplemented") }

// AppendMessage appends the wire encoding of m to buf.
func AppendMessage(buf []byte, m *Message) []byte { panic("unimplemented") }

// UnmarshalMessage decodes one message. Malformed input is an error, never a
// panic.
func UnmarshalMessage(b []byte) (Message, error) { panic("unimplemented") }

// AppendEntry appends the encoding of one entry (for the acceptor log).
func AppendEntry(buf []byte, e *Entry) []byte { panic("unimplemented") }

// UnmarshalEntry decodes one entry encoded by AppendEntry.
func UnmarshalEntry(b []byte) (Entry, error) { panic("unimplemented") }
