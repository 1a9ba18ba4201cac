package client

import (
	"errors"
	"fmt"
	"time"

	"synod/kv/proto"
)

// Sentinel errors; every error a call returns for a server status matches
// one of them with errors.Is.
var (
	ErrNotFound      = errors.New("client: not found")
	ErrCASMismatch   = errors.New("client: compare-and-swap mismatch")
	ErrNotLeader     = errors.New("client: not leader")
	ErrThrottled     = errors.New("client: throttled")
	ErrTooLarge      = errors.New("client: too large")
	ErrBadRequest    = errors.New("client: bad request")
	ErrUnauthorized  = errors.New("client: unauthorized")
	ErrUnavailable   = errors.New("client: unavailable")
	ErrSequenceStale = errors.New("client: write sequence already forgotten by the server")
	ErrInternal      = errors.New("client: server internal error")
	ErrClosed        = errors.New("client: closed")
	// ErrConnection wraps transport failures (dial, reset, protocol
	// violation by the server).
	ErrConnection = errors.New("client: connection failed")
	// ErrConflict: a membership operation conflicts with one in progress
	// (or a learner has not caught up); nothing was done (members.go).
	ErrConflict = errors.New("client: conflicts with a membership change in progress")
	// ErrNoSpace: the write would pass the tenant's storage quota, or the
	// node's disk is below its free-space reserve; nothing was written.
	ErrNoSpace = errors.New("client: no space (tenant quota or node disk reserve)")
)

var statusErrors = map[proto.Status]error{
	proto.StatusNotFound:      ErrNotFound,
	proto.StatusCASMismatch:   ErrCASMismatch,
	proto.StatusNotLeader:     ErrNotLeader,
	proto.StatusThrottled:     ErrThrottled,
	proto.StatusTooLarge:      ErrTooLarge,
	proto.StatusBadRequest:    ErrBadRequest,
	proto.StatusUnauthorized:  ErrUnauthorized,
	proto.StatusUnavailable:   ErrUnavailable,
	proto.StatusSequenceStale: ErrSequenceStale,
	proto.StatusInternal:      ErrInternal,
	proto.StatusConflict:      ErrConflict,
	proto.StatusNoSpace:       ErrNoSpace,
}

// StatusError is a non-OK response. errors.Is(err, ErrX) matches its status.
type StatusError struct {
	Status  proto.Status
	Message string
	// Leader: for NOT_LEADER, the leader's address when the server knew it.
	Leader string
	// CAS_MISMATCH: the current value (single-key CAS; HasCurrent false when
	// the key is absent or the answer came from the exactly-once table), or
	// the index of the failing operation of a Batch.
	Current    []byte
	HasCurrent bool
	FailedOp   uint32
}

func (e *StatusError) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("synod: %v: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("synod: %v", e.Status)
}

// Is matches the sentinel of e's status.
func (e *StatusError) Is(target error) bool { return statusErrors[e.Status] == target }

// ThrottledError is returned when the tenant stayed over its budget for
// every retry, or when waiting RetryAfter would pass the ctx deadline.
type ThrottledError struct {
	RetryAfter time.Duration
	Message    string
}

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("synod: THROTTLED: retry after %v", e.RetryAfter)
}

// Is matches ErrThrottled.
func (e *ThrottledError) Is(target error) bool { return target == ErrThrottled }

func errorOf(resp *proto.Response) error {
	switch resp.Status {
	case proto.StatusOK:
		return nil
	case proto.StatusThrottled:
		return &ThrottledError{RetryAfter: resp.RetryAfter, Message: resp.Message}
	}
	return &StatusError{Status: resp.Status, Message: resp.Message, Leader: resp.Leader,
		Current: resp.Value, HasCurrent: resp.HasValue, FailedOp: resp.FailedOp}
}
