package accel

import (
	"fmt"

	"synod/paxos"
)

// Kind says what an Event is. Kinds below KindOutputMin are inputs (things
// software or the network hand to the plane); the rest are outputs (what the
// plane emits). The numeric values are part of the trace format.
type Kind uint8

// Input kinds.
const (
	InTick           Kind = 1  // Now: the plane clock advances; timers are evaluated
	InSetRole        Kind = 2  // Flags: Role
	InSetBallot      Kind = 3  // Ballot: the ballot this node leads with
	InSetPromised    Kind = 4  // Ballot: the promised-ballot register
	InSetQuorum      Kind = 5  // Len: quorum size
	InSetMember      Kind = 6  // Index: member-table entry; Node: its NodeID (0 clears it)
	InSetSelf        Kind = 7  // Index: this node's member-table entry
	InSetWindowBase  Kind = 8  // Slot: lowest slot of the window
	InSetTenantOps   Kind = 9  // Index: tenant entry; Value: ops/s; Value2: burst (ops)
	InSetTenantBytes Kind = 10 // Index: tenant entry; Value: bytes/s; Value2: burst (bytes)
	InArm            Kind = 16 // Slot, Ballot: leader sent Accept(Slot, Ballot)
	InAccepted       Kind = 17 // Slot, Ballot, Node=from: an Accepted reached the leader
	InAccept         Kind = 18 // Slot, Ballot, Node=from, Len=payload bytes, Flags&FlagWALFailed
	InHeartbeat      Kind = 19 // Ballot, Node=from, Value=sentAt: a follower got a heartbeat
	InHeartbeatAck   Kind = 20 // Ballot, Node=from, Value=sentAt echoed: the leader got an ack
	InAdmit          Kind = 21 // Index: tenant entry; Len: frame bytes
)

// KindOutputMin is the first output kind.
const KindOutputMin Kind = 64

// Output kinds.
const (
	OutCommit          Kind = 64 // Slot, Ballot: quorum reached for (Slot, Ballot); once per armed entry
	OutHandUp          Kind = 65 // Reason, Len=input kind, Slot, Ballot, Node: software must handle the input
	OutSendAccepted    Kind = 66 // Slot, Ballot, Node=to (the Accept's sender): send Accepted now
	OutMirror          Kind = 67 // Slot, Ballot, Node=from: the fast path accepted; software must learn of it
	OutHeartbeat       Kind = 68 // Ballot, Value=sentAt: send a heartbeat to every member
	OutHeartbeatAck    Kind = 69 // Ballot, Node=to, Value=sentAt echoed: answer the leader's heartbeat
	OutLeaseGained     Kind = 70 // the leader's lease became valid
	OutLeaseLost       Kind = 71 // the leader's lease expired or was dropped
	OutElectionTimeout Kind = 72 // a follower heard no leader for its election timeout
	OutAdmit           Kind = 73 // Index: tenant entry; Reason: 1 admitted, 0 refused; Value: retry-after ticks
)

// FlagWALFailed on an InAccept says the WAL append or persist failed (the
// Go wrapper records the outcome so a replay is exact).
const FlagWALFailed uint8 = 1

// Role is the role register.
type Role uint8

const (
	RoleOff      Role = 0 // every input is handed up; no timers run
	RoleFollower Role = 1 // accept fast path and election timer
	RoleLeader   Role = 2 // aggregator, heartbeats and lease
)

// Reason says why an input was handed up (OutHandUp.Reason).
type Reason uint8

const (
	ReasonNone          Reason = 0
	ReasonRole          Reason = 1 // the input does not fit the role register
	ReasonWindow        Reason = 2 // slot outside [base, base+WindowSlots)
	ReasonNotArmed      Reason = 3 // no armed entry with this slot tag
	ReasonBallot        Reason = 4 // ballot differs from the armed entry's or the leader's
	ReasonStaleBallot   Reason = 5 // ballot below the promised register
	ReasonMember        Reason = 6 // sender is not in the member table, or self unset
	ReasonWAL           Reason = 7 // the WAL append or persist failed
	ReasonTenant        Reason = 8 // tenant index outside the table
	ReasonBadIndex      Reason = 9 // register index outside its table
	ReasonFuture        Reason = 10
	ReasonHigherBallot  Reason = 11 // a heartbeat from a ballot above the promise: software decides
	ReasonUnknownInput  Reason = 12
	ReasonBadQuorumSize Reason = 13
)

// Event is one input to or one output from the plane. It has the same fixed
// shape for every kind (a 64-byte trace record); which fields mean something
// depends on Kind, as listed at the kind constants. Unused fields are zero.
type Event struct {
	Seq    uint64 // logical sequence number of the input (an output carries its input's)
	Kind   Kind
	Flags  uint8  // InSetRole: Role; InAccept: FlagWALFailed; outputs: Reason
	Index  uint16 // member or tenant table index
	Len    uint32 // quorum, payload or frame bytes; OutHandUp: the input kind
	Now    uint64 // plane clock (ticks)
	Slot   paxos.Slot
	Ballot paxos.Ballot
	Node   paxos.NodeID
	Value  uint64
	Value2 uint64
}

// Reason returns the hand-up reason (OutHandUp) or the admit verdict (OutAdmit).
func (e Event) Reason() Reason { return Reason(e.Flags) }

// IsInput reports whether e is an input kind.
func (k Kind) IsInput() bool { return k < KindOutputMin }

var kindNames = map[Kind]string{
	InTick: "tick", InSetRole: "set-role", InSetBallot: "set-ballot", InSetPromised: "set-promised",
	InSetQuorum: "set-quorum", InSetMember: "set-member", InSetSelf: "set-self", InSetWindowBase: "set-window-base",
	InSetTenantOps: "set-tenant-ops", InSetTenantBytes: "set-tenant-bytes", InArm: "arm", InAccepted: "accepted",
	InAccept: "accept", InHeartbeat: "heartbeat", InHeartbeatAck: "heartbeat-ack", InAdmit: "admit",
	OutCommit: "COMMIT", OutHandUp: "HANDUP", OutSendAccepted: "SEND-ACCEPTED", OutMirror: "MIRROR",
	OutHeartbeat: "HEARTBEAT", OutHeartbeatAck: "HEARTBEAT-ACK", OutLeaseGained: "LEASE-GAINED",
	OutLeaseLost: "LEASE-LOST", OutElectionTimeout: "ELECTION-TIMEOUT", OutAdmit: "ADMIT",
}

func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Known reports whether k is a kind this version defines.
func (k Kind) Known() bool { _, ok := kindNames[k]; return ok }

func (e Event) String() string {
	return fmt.Sprintf("#%d %v flags=%d idx=%d len=%d now=%d slot=%d ballot=%d.%d node=%d v=%d v2=%d",
		e.Seq, e.Kind, e.Flags, e.Index, e.Len, e.Now, e.Slot, e.Ballot.Round, e.Ballot.Node, e.Node, e.Value, e.Value2)
}
