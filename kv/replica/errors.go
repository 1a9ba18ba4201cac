package replica

import (
	"errors"
	"fmt"

	"synod/paxos"
)

// Errors returned by Write and ReadBarrier. The backend maps them to
// protocol statuses.
var (
	// ErrBusy: a bounded queue is full; the client should back off
	// (THROTTLED).
	ErrBusy = errors.New("replica: busy, retry later")
	// ErrUnavailable: the outcome of a write is unknown (leadership was lost
	// or the deadline passed after it was proposed) or the replica cannot
	// serve now; the client retries with the same sequence (UNAVAILABLE).
	ErrUnavailable = errors.New("replica: unavailable, outcome unknown")
	// ErrLogFull: the PMem log has no room; writes are refused until a
	// snapshot lets it truncate (UNAVAILABLE, a form of backpressure).
	ErrLogFull = errors.New("replica: acceptor log full")
	// ErrStopped: the replica is shutting down.
	ErrStopped = errors.New("replica: stopped")
	// ErrTooLarge: a command exceeds CommandBytesMax; nothing was
	// proposed (TOO_LARGE).
	ErrTooLarge = errors.New("replica: command too large")
)

// ErrStateBehindLog: New refuses a state machine that is behind the acceptor
// log's truncation point (its state below that point is nowhere on this
// node).
var ErrStateBehindLog = errors.New("replica: state machine behind the acceptor log's truncation point")

// NotLeaderError says this replica does not lead; Leader is the leader
// this replica knows of (0 when unknown) and ClientAddr its client address.
type NotLeaderError struct {
	Leader     paxos.NodeID
	ClientAddr string
}

func (e *NotLeaderError) Error() string {
	if e.Leader == 0 {
		return "replica: not the leader (leader unknown)"
	}
	return fmt.Sprintf("replica: not the leader; leader is node %d at %s", e.Leader, e.ClientAddr)
}

// Is makes errors.Is(err, paxos.ErrNotLeader) true.
func (e *NotLeaderError) Is(target error) bool { return target == paxos.ErrNotLeader }
