package replica

import (
	"fmt"
	"io"
	"sync"
	"time"

	"synod/accel"
	"synod/paxos"
)

// accelMirror runs the accel plane's quorum aggregator beside software
// Paxos ("soft" accel, mirror mode): the leader arms a row for every Accept
// it sends, the receive loop feeds every Accepted to the plane before
// queueing it for the consensus loop, and a Checker compares the plane's
// commit decisions with the paxos AckEvents, which stay authoritative. The
// plane changes nothing on the wire, so nodes with and without accel share
// a cluster. Not wired yet: the follower accept fast path, the heartbeat
// and lease engine, and applying on the plane's commit events.
type accelMirror struct {
	plane   *accel.Plane
	checker *accel.Checker
	epoch   time.Time

	mu  sync.Mutex // guards buf (the receive and consensus loops both feed the plane)
	buf []accel.Event

	// Registers last written (consensus loop only).
	role     accel.Role
	ballot   paxos.Ballot
	promised paxos.Ballot
	base     paxos.Slot
}

// AccelConfig turns on the accel plane model.
type AccelConfig struct {
	// Trace, when non-nil, receives the plane's input/output trace (the
	// RTL co-simulation's input).
	Trace io.Writer
}

func newAccelMirror(cfg *Config, members []paxos.NodeID) (*accelMirror, error) {
	spec := accel.DefaultSpec()
	spec.Replicas = max(len(members), 1)
	spec.Quorum = len(members)/2 + 1
	toTicks := func(n int) uint32 { return uint32(time.Duration(n) * cfg.Tick / accel.TickDuration) }
	spec.HeartbeatPeriodTicks = max(toTicks(cfg.HeartbeatTicks), 1)
	spec.ElectionTicks = max(toTicks(cfg.ElectionTicks), spec.HeartbeatPeriodTicks+1)
	if cfg.LeaseTicks > 0 {
		spec.LeaseTicks = toTicks(cfg.LeaseTicks)
		spec.LeaseDriftTicks = min(toTicks(cfg.DriftTicks), spec.LeaseTicks-1)
	}
	a := &accelMirror{checker: accel.NewChecker(), epoch: time.Now()}
	opts := []accel.Option{accel.WithClock(a.now)}
	if cfg.Accel.Trace != nil {
		opts = append(opts, accel.WithTrace(cfg.Accel.Trace))
	}
	p, err := accel.New(spec, opts...)
	if err != nil {
		return nil, fmt.Errorf("creating the accel plane: %w", err)
	}
	a.plane = p
	a.mu.Lock()
	for i, id := range members {
		a.buf = p.SetMember(a.buf, i, id)
		if id == cfg.ID {
			a.buf = p.SetSelf(a.buf, i)
		}
	}
	a.buf = p.SetQuorum(a.buf, spec.Quorum)
	a.flushLocked()
	a.mu.Unlock()
	return a, nil
}

func (a *accelMirror) now() uint64 { return uint64(time.Since(a.epoch) / accel.TickDuration) }

// flushLocked hands the plane's outputs to the checker.
func (a *accelMirror) flushLocked() {
	if len(a.buf) > 0 {
		a.checker.Plane(a.buf)
		a.buf = a.buf[:0]
	}
}

// registers writes the plane's registers from the node's status (consensus
// loop, after Advance).
func (a *accelMirror) registers(s *paxos.Status) {
	role := accel.RoleOff
	switch s.Role {
	case paxos.RoleLeader:
		role = accel.RoleLeader
	case paxos.RoleFollower:
		role = accel.RoleFollower
	}
	base := s.Commit + 1
	if role == a.role && s.Ballot == a.ballot && s.Promised == a.promised && base == a.base {
		return
	}
	a.mu.Lock()
	if role != a.role {
		a.buf = a.plane.SetRole(a.buf, role)
	}
	if s.Ballot != a.ballot {
		a.buf = a.plane.SetBallot(a.buf, s.Ballot)
	}
	if s.Promised != a.promised {
		a.buf = a.plane.SetPromised(a.buf, s.Promised)
	}
	if base != a.base {
		a.buf = a.plane.SetWindowBase(a.buf, base)
	}
	a.flushLocked()
	a.mu.Unlock()
	a.role, a.ballot, a.promised, a.base = role, s.Ballot, s.Promised, base
}

// sending arms the aggregator for every entry of every Accept (consensus
// loop, after the leader's own acceptance is durable, before sending).
func (a *accelMirror) sending(msgs []paxos.Message) {
	a.mu.Lock()
	for i := range msgs {
		m := &msgs[i]
		if m.Type != paxos.MsgAccept {
			continue
		}
		for _, e := range m.Entries {
			a.buf = a.plane.Arm(a.buf, e.Slot, m.Ballot)
		}
	}
	a.flushLocked()
	a.mu.Unlock()
}

// received feeds an Accepted to the aggregator (receive loop, before the
// message is queued for the consensus loop).
func (a *accelMirror) received(m *paxos.Message) {
	if m.Type != paxos.MsgAccepted || m.Reject {
		return
	}
	last := max(m.Index, m.Slot)
	a.mu.Lock()
	a.buf = a.plane.OnAcceptedRange(a.buf, m.Slot, last, m.Ballot, m.From)
	a.flushLocked()
	a.mu.Unlock()
}

// software feeds the authoritative ack stream to the checker.
func (a *accelMirror) software(acks []paxos.AckEvent) {
	if len(acks) > 0 {
		a.checker.Software(acks)
	}
}

func (a *accelMirror) close() error { return a.plane.Close() }

// AccelResult reports the plane-versus-software commit check (zero when
// accel is off).
func (r *Replica) AccelResult() (accel.CheckResult, bool) {
	if r.accel == nil {
		return accel.CheckResult{}, false
	}
	return r.accel.checker.Result(), true
}
