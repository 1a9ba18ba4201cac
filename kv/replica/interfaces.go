package replica

import (
	"io"

	"synod/kv/sm"
	"synod/paxos"
)

// AcceptorLog is the durable acceptor state the Ready contract writes to:
// the promised ballot and the accepted entries. The PMem log implements it
// (see pmemlog.go); tests may use an in-memory one.
type AcceptorLog interface {
	// SetPromised makes b the durable promised ballot before returning.
	SetPromised(b paxos.Ballot) error
	// Append adds entries; they are durable only after Persist. A full log
	// returns an error wrapping ErrLogFull and appends nothing durable.
	Append(entries []paxos.Entry) error
	// Persist makes every appended entry durable.
	Persist() error
	// Recover returns the promised ballot and the latest accepted entry of
	// every slot above applied, in slot order.
	Recover(applied paxos.Slot) (paxos.Ballot, []paxos.Entry, error)
	// TruncateBelow drops entries with a slot below slot.
	TruncateBelow(slot paxos.Slot) error
	// TruncatedBelow is the durable truncation point: entries with a
	// slot below it were dropped (1 when nothing was).
	TruncatedBelow() paxos.Slot
	// Usage reports the bytes in use and the log's capacity.
	Usage() (used, capacity int64)
	// Mode names the durability mode ("dax", "msync", "shm", "memory").
	Mode() string
	Close() error
}

// StateMachine is the application the replica applies committed commands
// to; *sm.SM implements it.
type StateMachine interface {
	// Applied is the highest slot whose commands are in the state (stored
	// with the data: after a crash it is the last slot that reached disk).
	Applied() uint64
	// Apply applies the commands of one slot, atomically with recording
	// slot as applied, and returns one result per command. cmds may be
	// empty (a no-op slot still advances Applied). An error means storage
	// failed and the state can no longer be trusted.
	Apply(slot uint64, cmds [][]byte) ([]sm.Result, error)
	// Flush makes everything applied durable and returns that slot: the
	// acceptor log may be truncated up to it.
	Flush() (uint64, error)
	// Snapshot streams the state as of the last Apply and its slot.
	Snapshot() (io.ReadCloser, uint64, error)
	// Restore replaces the state with a snapshot stream, durably.
	Restore(r io.Reader) error
}
