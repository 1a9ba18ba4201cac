package accel

import (
	"fmt"
	"math/bits"

	"synod/paxos"
	"synod/tenants"
)

// slotEntry is one row of the quorum aggregator's table.
type slotEntry struct {
	tag       paxos.Slot // the slot this row was armed for
	ballot    paxos.Ballot
	mask      uint16 // ack bitmask over member-table indexes
	valid     bool   // armed at least once
	committed bool   // the commit event for (tag, ballot) was emitted
}

// tenantBuckets is one row of the shaper's table.
type tenantBuckets struct {
	ops, bytes tenants.Bucket
}

// state is the plane's whole state: fixed-size once New has sized the two
// tables, integers only, as the RTL holds it. Every field changes only in
// apply.
type state struct {
	spec Spec

	// Registers software writes.
	role       Role
	ballot     paxos.Ballot // the ballot this node leads with (leader)
	promised   paxos.Ballot // the promised-ballot register (follower fast path)
	quorum     uint32
	members    [ReplicasMax]paxos.NodeID // 0: empty entry
	memberMask uint16                    // bit i set iff members[i] != 0
	self       uint16                    // this node's member index
	selfValid  bool
	base       paxos.Slot // window is [base, base+WindowSlots)

	// removed[i] is the NodeID entry i held before software cleared it;
	// written and read only under TestingCountRemovedMembers (a planted
	// bug, testhooks.go), all zero otherwise.
	removed [ReplicasMax]paxos.NodeID

	now uint64 // plane clock: the largest Now seen

	// Quorum aggregator.
	table []slotEntry // WindowSlots rows, indexed by slot & (WindowSlots-1)

	// Heartbeat and lease engine.
	nextHeartbeat    uint64
	ackSeen          uint16
	lastAck          [ReplicasMax]uint64 // sentAt of the newest acked heartbeat, per member
	leaseValid       bool
	electionDeadline uint64
	electionFired    bool
	lfsr             uint32

	// Shaper.
	buckets []tenantBuckets // TenantsMax rows
}

// lfsrSeedDefault replaces a zero seed (xorshift stays at zero forever).
const lfsrSeedDefault = 0x9E3779B9

func newState(spec Spec) *state {
	s := &state{
		spec:    spec,
		quorum:  uint32(spec.Quorum),
		table:   make([]slotEntry, spec.WindowSlots),
		buckets: make([]tenantBuckets, spec.TenantsMax),
		lfsr:    spec.Seed,
	}
	if s.lfsr == 0 {
		s.lfsr = lfsrSeedDefault
	}
	return s
}

// xorshift32 steps the jitter generator (Marsaglia's 13/17/5 triple).
func (s *state) xorshift32() uint32 {
	x := s.lfsr
	x ^= x << 13
	x ^= x >> 17
	x ^= x << 5
	s.lfsr = x
	return x
}

func (s *state) resetElection() {
	jitter := uint64(0)
	if s.spec.ElectionJitterTicks != 0 {
		jitter = uint64(s.xorshift32() & (s.spec.ElectionJitterTicks - 1))
	}
	s.electionDeadline = s.now + uint64(s.spec.ElectionTicks) + jitter
	s.electionFired = false
}

// memberIndex looks from up in the member table (a CAM in the RTL).
func (s *state) memberIndex(from paxos.NodeID) (uint16, bool) {
	if from == 0 {
		return 0, false
	}
	for i := 0; i < s.spec.Replicas; i++ {
		if s.members[i] == from {
			return uint16(i), true
		}
	}
	return 0, false
}

func (s *state) inWindow(slot paxos.Slot) bool {
	return slot >= s.base && slot-s.base < paxos.Slot(s.spec.WindowSlots)
}

func (s *state) dropLease(out []Event, in *Event) []Event {
	if s.leaseValid {
		s.leaseValid = false
		out = append(out, Event{Seq: in.Seq, Kind: OutLeaseLost, Now: s.now, Ballot: s.ballot})
	}
	return out
}

func handUp(out []Event, in *Event, now uint64, r Reason) []Event {
	return append(out, Event{Seq: in.Seq, Kind: OutHandUp, Flags: uint8(r), Index: in.Index, Len: uint32(in.Kind),
		Now: now, Slot: in.Slot, Ballot: in.Ballot, Node: in.Node})
}

// apply is the plane's transition function: one input in, its outputs
// appended to out, in a fixed order. It is pure in (state, input) — the
// RTL implements the same function — and never fails: anything it cannot
// handle becomes an OutHandUp.
func (s *state) apply(in Event, out []Event) []Event {
	if in.Now > s.now {
		s.now = in.Now
	}
	switch in.Kind {
	case InTick:
		return s.tick(in, out)
	case InSetRole:
		return s.setRole(in, out)
	case InSetBallot:
		if in.Ballot != s.ballot {
			s.ballot = in.Ballot
			s.ackSeen = 0
			// LEASE-LOST carries the new ballot (the register is written
			// first); rtl/ mirrors this order.
			out = s.dropLease(out, &in)
		}
		return out
	case InSetPromised:
		s.promised = in.Ballot
		return out
	case InSetQuorum:
		if in.Len < 1 || in.Len > uint32(s.spec.Replicas) {
			return handUp(out, &in, s.now, ReasonBadQuorumSize)
		}
		s.quorum = in.Len
		return out
	case InSetMember:
		if int(in.Index) >= s.spec.Replicas {
			return handUp(out, &in, s.now, ReasonBadIndex)
		}
		s.noteMemberWrite(in.Index, in.Node)
		s.members[in.Index] = in.Node
		bit := uint16(1) << in.Index
		if in.Node != 0 {
			s.memberMask |= bit
		} else {
			s.memberMask &^= bit
		}
		s.ackSeen &^= bit
		return out
	case InSetSelf:
		if int(in.Index) >= s.spec.Replicas {
			return handUp(out, &in, s.now, ReasonBadIndex)
		}
		s.self, s.selfValid = in.Index, true
		return out
	case InSetWindowBase:
		s.base = in.Slot
		return out
	case InSetTenantOps, InSetTenantBytes:
		if int(in.Index) >= s.spec.TenantsMax {
			return handUp(out, &in, s.now, ReasonTenant)
		}
		b := &s.buckets[in.Index].ops
		if in.Kind == InSetTenantBytes {
			b = &s.buckets[in.Index].bytes
		}
		b.SetRate(in.Value, in.Value2, s.now)
		return out
	case InArm:
		return s.arm(in, out)
	case InAccepted:
		return s.accepted(in, out)
	case InAccept:
		return s.accept(in, out)
	case InHeartbeat:
		return s.heartbeat(in, out)
	case InHeartbeatAck:
		return s.heartbeatAck(in, out)
	case InAdmit:
		if int(in.Index) >= s.spec.TenantsMax {
			return handUp(out, &in, s.now, ReasonTenant)
		}
		tb := &s.buckets[in.Index]
		ok, wait := tenants.AdmitPair(&tb.ops, &tb.bytes, uint64(in.Len), s.now)
		verdict := uint8(0)
		if ok {
			verdict = 1
		}
		return append(out, Event{Seq: in.Seq, Kind: OutAdmit, Flags: verdict, Index: in.Index, Len: in.Len, Now: s.now, Value: wait})
	}
	return handUp(out, &in, s.now, ReasonUnknownInput)
}

func (s *state) setRole(in Event, out []Event) []Event {
	r := Role(in.Flags)
	if r > RoleLeader {
		return handUp(out, &in, s.now, ReasonRole)
	}
	if r == s.role {
		return out
	}
	s.role = r
	out = s.dropLease(out, &in)
	s.ackSeen = 0
	switch r {
	case RoleLeader:
		s.nextHeartbeat = s.now // the first heartbeat goes out on the next tick
	case RoleFollower:
		s.resetElection()
	}
	return out
}

// tick evaluates the timers in a fixed order: lease, heartbeat, election.
func (s *state) tick(in Event, out []Event) []Event {
	switch s.role {
	case RoleLeader:
		valid := s.leaseHolds()
		if valid && !s.leaseValid {
			s.leaseValid = true
			out = append(out, Event{Seq: in.Seq, Kind: OutLeaseGained, Now: s.now, Ballot: s.ballot})
		} else if !valid {
			out = s.dropLease(out, &in)
		}
		if s.now >= s.nextHeartbeat {
			out = append(out, Event{Seq: in.Seq, Kind: OutHeartbeat, Now: s.now, Ballot: s.ballot, Value: s.now})
			s.nextHeartbeat = s.now + uint64(s.spec.HeartbeatPeriodTicks)
		}
	case RoleFollower:
		if !s.electionFired && s.now >= s.electionDeadline {
			s.electionFired = true
			out = append(out, Event{Seq: in.Seq, Kind: OutElectionTimeout, Now: s.now, Ballot: s.promised})
		}
	}
	return out
}

// leaseHolds: the leader itself plus every member whose newest acked
// heartbeat was sent less than LeaseTicks-LeaseDriftTicks ago must reach
// the quorum. Counting from the send time (echoed in the ack) rather than
// the receive time keeps the lease safe however late the ack arrives.
func (s *state) leaseHolds() bool {
	if !s.selfValid {
		return false
	}
	span := uint64(s.spec.LeaseTicks - s.spec.LeaseDriftTicks)
	n := uint32(1)
	for i := 0; i < s.spec.Replicas; i++ {
		bit := uint16(1) << i
		if uint16(i) == s.self || s.memberMask&bit == 0 || s.ackSeen&bit == 0 {
			continue
		}
		if s.lastAck[i]+span > s.now {
			n++
		}
	}
	return n >= s.quorum
}

func (s *state) arm(in Event, out []Event) []Event {
	switch {
	case s.role != RoleLeader:
		return handUp(out, &in, s.now, ReasonRole)
	case !s.selfValid:
		return handUp(out, &in, s.now, ReasonMember)
	case !s.inWindow(in.Slot):
		return handUp(out, &in, s.now, ReasonWindow)
	}
	e := &s.table[uint64(in.Slot)&uint64(s.spec.WindowSlots-1)]
	if e.valid && e.tag == in.Slot && e.ballot == in.Ballot {
		return out // a duplicate Arm keeps the acks already counted
	}
	*e = slotEntry{tag: in.Slot, ballot: in.Ballot, mask: 1 << s.self, valid: true}
	return s.maybeCommit(e, &in, out)
}

func (s *state) maybeCommit(e *slotEntry, in *Event, out []Event) []Event {
	if !e.committed && uint32(bits.OnesCount16(e.mask&s.aggMemberMask())) >= s.quorum {
		e.committed = true
		out = append(out, Event{Seq: in.Seq, Kind: OutCommit, Now: s.now, Slot: e.tag, Ballot: e.ballot})
	}
	return out
}

func (s *state) accepted(in Event, out []Event) []Event {
	if s.role != RoleLeader {
		return handUp(out, &in, s.now, ReasonRole)
	}
	// Tags are whole slot numbers, so a row whose tag matches is that
	// slot's row even below the window base: a late ack for a slot
	// committed and passed is counted (harmlessly) rather than handed up.
	// Above the window nothing can be armed.
	e := &s.table[uint64(in.Slot)&uint64(s.spec.WindowSlots-1)]
	if in.Slot >= s.base+paxos.Slot(s.spec.WindowSlots) || (in.Slot < s.base && !(e.valid && e.tag == in.Slot)) {
		return handUp(out, &in, s.now, ReasonWindow)
	}
	if !e.valid || e.tag != in.Slot {
		return handUp(out, &in, s.now, ReasonNotArmed)
	}
	// The ack must match the row AND the ballot this node leads with now:
	// a row left at an older ballot of ours (armed before a step-down and
	// re-election, and not re-armed) must not commit from a late ack at
	// that old ballot while software, leading at the new ballot, ignores
	// it. Found by the paxossim harness (accel/sim_test.go, seed 564).
	if e.ballot != in.Ballot || in.Ballot != s.ballot {
		return handUp(out, &in, s.now, ReasonBallot)
	}
	idx, ok := s.aggMemberIndex(in.Node)
	if !ok {
		return handUp(out, &in, s.now, ReasonMember)
	}
	e.mask |= 1 << idx
	return s.maybeCommit(e, &in, out)
}

// acceptCheck is the fast path's admission test, shared by apply and by the
// Go wrapper that decides whether to touch the WAL at all.
func (s *state) acceptCheck(in *Event) Reason {
	switch {
	case s.role != RoleFollower:
		return ReasonRole
	case in.Ballot.Less(s.promised):
		return ReasonStaleBallot
	case !s.inWindow(in.Slot):
		return ReasonWindow
	}
	return ReasonNone
}

func (s *state) accept(in Event, out []Event) []Event {
	if r := s.acceptCheck(&in); r != ReasonNone {
		return handUp(out, &in, s.now, r)
	}
	if in.Flags&FlagWALFailed != 0 {
		return handUp(out, &in, s.now, ReasonWAL)
	}
	if s.promised.Less(in.Ballot) {
		s.promised = in.Ballot // accepting b is promising b
	}
	s.resetElection() // an Accept is leader contact
	out = append(out, Event{Seq: in.Seq, Kind: OutSendAccepted, Now: s.now, Slot: in.Slot, Ballot: in.Ballot, Node: in.Node})
	return append(out, Event{Seq: in.Seq, Kind: OutMirror, Len: in.Len, Now: s.now, Slot: in.Slot, Ballot: in.Ballot, Node: in.Node})
}

func (s *state) heartbeat(in Event, out []Event) []Event {
	switch {
	case s.role != RoleFollower:
		return handUp(out, &in, s.now, ReasonRole)
	case in.Ballot.Less(s.promised):
		return handUp(out, &in, s.now, ReasonStaleBallot)
	case in.Ballot != s.promised:
		return handUp(out, &in, s.now, ReasonHigherBallot)
	}
	if _, ok := s.memberIndex(in.Node); !ok {
		return handUp(out, &in, s.now, ReasonMember)
	}
	s.resetElection()
	return append(out, Event{Seq: in.Seq, Kind: OutHeartbeatAck, Now: s.now, Ballot: in.Ballot, Node: in.Node, Value: in.Value})
}

func (s *state) heartbeatAck(in Event, out []Event) []Event {
	switch {
	case s.role != RoleLeader:
		return handUp(out, &in, s.now, ReasonRole)
	case in.Ballot != s.ballot:
		return handUp(out, &in, s.now, ReasonBallot)
	case in.Value > s.now:
		return handUp(out, &in, s.now, ReasonFuture)
	}
	idx, ok := s.memberIndex(in.Node)
	if !ok {
		return handUp(out, &in, s.now, ReasonMember)
	}
	bit := uint16(1) << idx
	if s.ackSeen&bit == 0 || in.Value > s.lastAck[idx] {
		s.lastAck[idx] = in.Value
	}
	s.ackSeen |= bit
	return out
}

// String summarizes the registers (for test failures).
func (s *state) String() string {
	return fmt.Sprintf("role=%d ballot=%v promised=%v quorum=%d members=%v mask=%#x self=%d base=%d now=%d lease=%v",
		s.role, s.ballot, s.promised, s.quorum, s.members[:s.spec.Replicas], s.memberMask, s.self, s.base, s.now, s.leaseValid)
}
