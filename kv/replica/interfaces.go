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
	// Installed is the slot of the snapshot the state was last restored
	// from (0: never). Every slot above it, through Applied, was applied
	// from this node's own log, so the acceptor log's record of such a
	// slot is the value applied there (recover_tail.go relies on it); a
	// state that cannot tell reports Applied.
	Installed() uint64
	// Apply applies the commands of one slot, atomically with recording
	// slot as applied, and returns one result per command. cmds may be
	// empty (a no-op slot still advances Applied). An error means storage
	// failed and the state can no longer be trusted.
	Apply(slot uint64, cmds [][]byte) ([]sm.Result, error)
	// Flush makes everything applied durable and returns that slot: the
	// acceptor log may be truncated up to it.
	Flush() (uint64, error)
	// FlushAsync starts what Flush does without waiting: it returns the
	// applied slot and a channel closed once that slot is durable.
	FlushAsync() (uint64, <-chan struct{}, error)
	// Snapshot streams the state as of the last Apply and its slot, from
	// a consistent snapshot of the store taken in O(1) (served to
	// laggards; close it when done).
	Snapshot() (io.ReadCloser, uint64, error)
	// SnapshotDelta is Snapshot as a delta stream against a fetcher's
	// digest (only the ranges that differ); a malformed digest is
	// sm.ErrBadDigest.
	SnapshotDelta(digest []byte) (io.ReadCloser, uint64, error)
	// BeginStage starts staging a snapshot stream fetched from a peer,
	// beside the live state (at most one at a time); the Stager's Finish
	// leaves it complete and durable.
	BeginStage() (*sm.Stager, error)
	// BeginDeltaStage is BeginStage for a delta stream: the staging
	// starts as a checkpoint of the live state, whose digest the Stager
	// computes (Stager.Digest) for the request.
	BeginDeltaStage() (*sm.Stager, error)
	// InstallStaged swaps in the complete staged copy, which must be at
	// slot.
	InstallStaged(slot uint64) error
	// DiscardStaged removes a staged copy, complete or not.
	DiscardStaged() error
	// ApplyMembership applies a committed membership change: it records
	// the encoded membership (sm.EncodeMembership) with slot as applied,
	// atomically; a malformed one changes nothing and is an error wrapping
	// sm.ErrBadMembership.
	ApplyMembership(slot uint64, encoded []byte) error
	// Membership is the membership last recorded (ok false: none).
	Membership() (m sm.Membership, ok bool, err error)
}
