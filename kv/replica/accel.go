package replica

import (
	"context"
	"fmt"
	"io"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"synod/accel"
	"synod/paxos"
)

// accelWindowSlots is the plane's slot window (aggregator table and
// follower accept window). It must not exceed how far above its commit
// index a paxos acceptor stores entries (4 x its in-flight window of 1024
// slots) nor the leader's in-flight window (1024): the fast path must never
// persist an entry that paxos, handed the same Accept, would not store.
const accelWindowSlots = 1024

// accelMirror is the accel plane ("soft" accel) wired into the runtime.
// Software Paxos stays authoritative; the plane takes the mechanical work
// off the consensus loop:
//
//   - Leader (accel_commit.go): Accept entries are armed in the quorum
//     aggregator once the leader's own acceptance is durable; the receive
//     loop feeds every Accepted to it, and its commit event for (slot,
//     ballot) hands the slot's value (the entry this leader proposed at
//     that ballot) straight to the apply loop, in slot order, so writers
//     are answered without waiting for the consensus loop. The plane's
//     commit decisions are compared with paxos's AckEvents (accel_check.go).
//   - Follower (accel_fast.go): an Accept at the promised ballot is
//     persisted and answered from the receive loop, then mirrored to paxos.
//   - Heartbeats and election timer (accel_heartbeat.go): on their own
//     goroutine, so a busy consensus loop does not cause elections; paxos
//     runs with ExternalElection and campaigns when the plane says so.
//
// Nodes with and without accel share a cluster: the wire format of
// consensus messages is unchanged, accel heartbeat frames are ignored by
// nodes without accel, and paxos's own heartbeats keep running.
type accelMirror struct {
	r       *Replica
	plane   *accel.Plane
	check   *accelCheck
	epoch   time.Time
	mask    paxos.Slot // accelWindowSlots - 1
	cancel  context.CancelFunc
	timerWG sync.WaitGroup

	mu  sync.Mutex // guards buf, props, earlyNext (receive and consensus loops)
	buf []accel.Event
	// props holds, per aggregator row, the entry this leader proposed for
	// (slot, ballot) and whether the plane committed it (accel_commit.go).
	props     []proposedRow
	earlyNext paxos.Slot // the next slot the early path may hand to the apply loop
	// delivered is the highest slot the consensus loop handed to the apply
	// loop (entries or snapshot).
	delivered atomic.Uint64

	// table is the plane's member table, voters the voters it was
	// written for (accel_members.go; consensus loop, under mu).
	table  [accel.ReplicasMax]paxos.NodeID
	voters []paxos.NodeID

	fast fastPath  // follower accept fast path (accel_fast.go)
	wal  *accelWAL // the fast path's WAL: the acceptor log

	// Registers last written (consensus loop only).
	role      accel.Role
	forceRole bool // write the role again (re-arms the election timer)
	ballot    paxos.Ballot
	promised  paxos.Ballot
	base      paxos.Slot

	contactPending atomic.Bool // a NoteLeaderContact is queued
	earlyApplied   atomic.Uint64
	elections      atomic.Uint64
	wedgedBeats    atomic.Uint64 // heartbeats withheld while the consensus loop was wedged
}

// AccelConfig turns on the accel plane model.
type AccelConfig struct {
	// Trace, when non-nil, receives the plane's input/output trace (the
	// RTL co-simulation's input).
	Trace io.Writer
}

// AccelStats counts what the wiring did (zero when accel is off).
type AccelStats struct {
	accel.Stats
	// FastAccepts counts slots the follower fast path persisted and
	// answered from the receive loop.
	FastAccepts uint64
	// SkippedAppends counts accepted entries software did not persist
	// again because the fast path had.
	SkippedAppends uint64
	// EarlyApplied counts slots handed to the apply loop on the plane's
	// commit event, ahead of the consensus loop.
	EarlyApplied uint64
	// Campaigns counts elections started on the plane's election timeout.
	Campaigns uint64
	// WedgedHeartbeats counts heartbeat rounds the plane withheld because
	// the consensus loop was wedged (loopWedgedElections).
	WedgedHeartbeats uint64
}

func newAccelMirror(r *Replica, members []paxos.NodeID, promised paxos.Ballot) (*accelMirror, error) {
	cfg := &r.cfg
	spec := accel.DefaultSpec()
	spec.WindowSlots = accelWindowSlots
	spec.Replicas = accel.ReplicasMax // room for the voters to change (accel_members.go)
	spec.Quorum = len(members)/2 + 1
	toTicks := func(n int) uint32 { return uint32(time.Duration(n) * cfg.Tick / accel.TickDuration) }
	spec.HeartbeatPeriodTicks = max(toTicks(cfg.HeartbeatTicks), 1)
	spec.ElectionTicks = max(toTicks(cfg.ElectionTicks), spec.HeartbeatPeriodTicks+1)
	// Paxos draws its timeout from [E, 2E); the plane's jitter is a power
	// of two, the largest not above E.
	spec.ElectionJitterTicks = 1 << (bits.Len32(spec.ElectionTicks) - 1)
	if cfg.LeaseTicks > 0 {
		spec.LeaseTicks = toTicks(cfg.LeaseTicks)
		spec.LeaseDriftTicks = min(toTicks(cfg.DriftTicks), spec.LeaseTicks-1)
	}
	spec.Seed = uint32(cfg.ID)*0x9E3779B9 | 1
	if cfg.Tenants != nil {
		spec.TenantsMax = min(max(spec.TenantsMax, len(cfg.Tenants.All())), accel.TenantsMax)
	}
	a := &accelMirror{r: r, check: newAccelCheck(), epoch: r.cfg.Now(), mask: accelWindowSlots - 1,
		props: make([]proposedRow, accelWindowSlots)}
	a.fast.init(promised)
	a.wal = &accelWAL{log: r.alog}
	opts := []accel.Option{accel.WithClock(a.now), accel.WithWAL(a.wal)}
	if cfg.Accel.Trace != nil {
		opts = append(opts, accel.WithTrace(cfg.Accel.Trace))
	}
	p, err := accel.New(spec, opts...)
	if err != nil {
		return nil, fmt.Errorf("creating the accel plane: %w", err)
	}
	a.plane = p
	a.mu.Lock()
	a.setMembersLocked(members)
	if !promised.IsZero() {
		a.buf = p.SetPromised(a.buf, promised)
		a.promised = promised
	}
	a.flushLocked()
	a.mu.Unlock()
	return a, nil
}

func (a *accelMirror) now() uint64 { return uint64(a.r.cfg.Now().Sub(a.epoch) / accel.TickDuration) }

// flushLocked hands the plane's outputs to the checker.
func (a *accelMirror) flushLocked() {
	if len(a.buf) > 0 {
		a.check.plane(a.buf)
		a.buf = a.buf[:0]
	}
}

// registers writes the plane's registers from the node's status and opens
// or closes the follower fast path (consensus loop, after the Ready loop).
func (a *accelMirror) registers(s *paxos.Status) {
	a.syncMembers(s.Members)
	role := accel.RoleOff
	switch s.Role {
	case paxos.RoleLeader:
		role = accel.RoleLeader
	case paxos.RoleFollower, paxos.RoleCandidate:
		// A candidate keeps the election timer: with ExternalElection
		// paxos never retries a stuck phase 1 on its own.
		role = accel.RoleFollower
	}
	a.fast.reopen(s, a.r.stalled == nil)
	base := s.Commit + 1
	if role == a.role && !a.forceRole && s.Ballot == a.ballot && s.Promised == a.promised && base == a.base {
		a.check.forgetBelow(s.Commit)
		return
	}
	if role != a.role || s.Ballot != a.ballot {
		// Rows of another leadership waiting for their Arm never get it
		// while this one lasts (accel_own.go).
		a.releaseUnarmed(s.Ballot)
	}
	a.mu.Lock()
	if role != a.role || a.forceRole {
		if a.forceRole && role == a.role {
			a.buf = a.plane.SetRole(a.buf, accel.RoleOff)
		}
		a.buf = a.plane.SetRole(a.buf, role)
		a.forceRole = false
	}
	if s.Ballot != a.ballot {
		a.buf = a.plane.SetBallot(a.buf, s.Ballot)
	}
	if a.promised.Less(s.Promised) {
		a.buf = a.plane.SetPromised(a.buf, s.Promised)
		a.promised = s.Promised
	}
	if base != a.base {
		a.buf = a.plane.SetWindowBase(a.buf, base)
	}
	a.flushLocked()
	a.mu.Unlock()
	a.role, a.ballot, a.base = role, s.Ballot, base
	a.check.forgetBelow(s.Commit)
}

// promisedDurable runs on the consensus loop right after the promised
// ballot b is durable and before any message of that Ready is sent: the
// plane's promised register never lags the durable promise.
func (a *accelMirror) promisedDurable(b paxos.Ballot) {
	a.fast.durable(b)
	a.mu.Lock()
	if a.promised.Less(b) {
		a.buf = a.plane.SetPromised(a.buf, b)
		a.promised = b
	}
	a.flushLocked()
	a.mu.Unlock()
}

// software feeds the authoritative ack stream to the checker.
func (a *accelMirror) software(acks []paxos.AckEvent) {
	if len(acks) > 0 {
		a.check.software(acks)
	}
}

func (a *accelMirror) close() error {
	if a.cancel != nil {
		a.cancel()
	}
	a.timerWG.Wait()
	return a.plane.Close()
}

// AccelResult reports the plane-versus-software commit check (zero when
// accel is off).
func (r *Replica) AccelResult() (accel.CheckResult, bool) {
	if r.accel == nil {
		return accel.CheckResult{}, false
	}
	r.accel.excuseWaiting() // accel_own.go
	return r.accel.check.result(), true
}

// AccelStats reports what the accel wiring did (false when accel is off).
func (r *Replica) AccelStats() (AccelStats, bool) {
	if r.accel == nil {
		return AccelStats{}, false
	}
	a := r.accel
	return AccelStats{
		Stats:            a.plane.Stats(),
		FastAccepts:      a.fast.accepts.Load(),
		SkippedAppends:   a.fast.skipped.Load(),
		EarlyApplied:     a.earlyApplied.Load(),
		Campaigns:        a.elections.Load(),
		WedgedHeartbeats: a.wedgedBeats.Load(),
	}, true
}
