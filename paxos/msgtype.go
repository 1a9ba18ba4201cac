package paxos

// Message types. The numeric values are part of the wire format.
const (
	// MsgPreCheck asks whether the receiver has heard from a leader within
	// the election timeout (Context: round, Commit: sender's commit).
	MsgPreCheck MsgType = 1
	// MsgPreCheckResp answers MsgPreCheck (Reject when it has).
	MsgPreCheckResp MsgType = 2
	// MsgPrepare is phase 1a for every slot >= Slot under Ballot.
	MsgPrepare MsgType = 3
	// MsgPromise is phase 1b: the acceptor's entries in [Slot, Index], its
	// highest slot (Last) and its commit index (Commit). Entries at or
	// below Commit are chosen values.
	MsgPromise MsgType = 4
	// MsgAccept is phase 2a for the contiguous Entries, with the leader's
	// commit index piggybacked.
	MsgAccept MsgType = 5
	// MsgAccepted is phase 2b for slots [Slot, Index] under Ballot, with
	// the acceptor's commit index.
	MsgAccepted MsgType = 6
	// MsgHeartbeat carries the leader's commit index and a sequence number
	// (Context); acking it grants the leader a lease.
	MsgHeartbeat MsgType = 7
	// MsgHeartbeatResp acknowledges a heartbeat (Context) and reports the
	// acceptor's commit index.
	MsgHeartbeatResp MsgType = 8
	// MsgCatchup carries chosen entries from the receiver's commit+1 on.
	MsgCatchup MsgType = 9
	// MsgSnapshot carries an application snapshot for an acceptor that lags
	// below the sender's first log slot. The leader sends it under its
	// ballot; any other node sends it with the zero ballot when it refuses
	// a pre-check or prepare from a node below its compaction point (a
	// snapshot holds only chosen state, so it is safe from anyone).
	MsgSnapshot MsgType = 10
	// MsgTransfer is a leader's hand-over (TransferLeadership, transfer.go):
	// sent under its ballot as it steps down, it releases the lease the
	// receiver granted the sender, and tells the receiver named in Context
	// to campaign at once.
	MsgTransfer MsgType = 11

	msgTypeMax = MsgTransfer
)

func (t MsgType) String() string {
	switch t {
	case MsgPreCheck:
		return "PreCheck"
	case MsgPreCheckResp:
		return "PreCheckResp"
	case MsgPrepare:
		return "Prepare"
	case MsgPromise:
		return "Promise"
	case MsgAccept:
		return "Accept"
	case MsgAccepted:
		return "Accepted"
	case MsgHeartbeat:
		return "Heartbeat"
	case MsgHeartbeatResp:
		return "HeartbeatResp"
	case MsgCatchup:
		return "Catchup"
	case MsgSnapshot:
		return "Snapshot"
	case MsgTransfer:
		return "Transfer"
	}
	return "MsgType(?)"
}

// fromProposer reports whether messages of type t are sent by a proposer
// under its own ballot (so Ballot.Node must equal From).
func (t MsgType) fromProposer() bool {
	switch t {
	case MsgPrepare, MsgAccept, MsgHeartbeat, MsgCatchup, MsgTransfer:
		return true
	}
	return false
}
