package proto

import "encoding/binary"

// Membership operations (kvctl member): list, add a learner, promote a
// learner, remove a member, transfer leadership. They are operator
// requests: each carries the node's admin token (its [admin] token), which
// is not a tenant token, and a node without one answers UNAUTHORIZED. Only
// the leader executes them; a follower answers NOT_LEADER with the
// leader's address, like any other operation. See docs/protocol.md.
//
// Request bodies (big-endian):
//
//	MEMBER_LIST                 admin token (u16 len, bytes)
//	MEMBER_ADD                  admin token | id u64 | consensus addr (u16 len, bytes) | client addr (u16 len, bytes)
//	MEMBER_REMOVE, _PROMOTE     admin token | id u64
//	TRANSFER_LEADER             admin token | id u64 (the voter to hand leadership to)
//
// Every OK response body is the membership after the operation (for
// TRANSFER_LEADER, with the new leader):
//
//	leader u64 | slot u64 | flags u8 (bit 0: a change or transfer is in progress) | count u16 | member*
//	member := id u64 | flags u8 (bit 0 learner, bit 1 tracked, bit 2 reachable) | commit u64 |
//	          consensus addr (u16 len, bytes) | client addr (u16 len, bytes)
//
// A member's commit is its commit index as the leader last heard it, set
// only when tracked (and zero otherwise).

// Limits of the membership operations.
const (
	// AdminTokenBytesMax bounds the admin token a request carries.
	AdminTokenBytesMax = 256
	// MembershipMembersMax bounds the members of a membership reply (the
	// group's own limit, paxos.MembersMax).
	MembershipMembersMax = 64
	// MemberIDMax is the largest member id (ids are 1..63: the runtime
	// keeps per-peer bitmasks of 64 bits, kv/replica peersMax). A request
	// naming a larger one is malformed, refused before its admin token is
	// checked.
	MemberIDMax = 63
)

// Wire bits of a membership reply.
const (
	membershipFlagPending = 1 << 0
	memberFlagLearner     = 1 << 0
	memberFlagTracked     = 1 << 1
	memberFlagReachable   = 1 << 2
	memberFlagsKnown      = memberFlagLearner | memberFlagTracked | memberFlagReachable
)

// IsMember reports whether o is a membership operation (an operator
// request that carries the admin token).
func (o Opcode) IsMember() bool { return o >= OpMemberList && o <= OpTransferLeader }

// MembershipReply is the OK body of every membership operation.
type MembershipReply struct {
	Leader uint64 // the leader's id
	// Slot is the slot of the change that decided this membership (0: the
	// cluster still runs on its bootstrap peers).
	Slot uint64
	// Pending says a membership change or a leadership transfer is in
	// progress (a new one would be refused).
	Pending bool
	Members []MemberInfo
}

// MemberInfo is one member in a MembershipReply.
type MemberInfo struct {
	ID            uint64
	Learner       bool
	ConsensusAddr string
	ClientAddr    string
	// Tracked: the leader replicates to it and Commit is its commit index
	// as last reported; Reachable: it answered within an election timeout.
	Tracked   bool
	Reachable bool
	Commit    uint64
}

func appendMemberRequest(b []byte, req *Request) []byte {
	b = appendBytes16(b, []byte(req.AdminToken))
	switch req.Op {
	case OpMemberAdd:
		b = binary.BigEndian.AppendUint64(b, req.MemberID)
		b = appendBytes16(b, []byte(req.ConsensusAddr))
		b = appendBytes16(b, []byte(req.ClientAddr))
	case OpMemberRemove, OpMemberPromote, OpTransferLeader:
		b = binary.BigEndian.AppendUint64(b, req.MemberID)
	}
	return b
}

func readMemberRequest(r *reader, req *Request) {
	req.AdminToken = string(r.bytes16("admin token", AdminTokenBytesMax))
	if r.err == nil && req.AdminToken == "" {
		r.fail("empty admin token")
	}
	switch req.Op {
	case OpMemberAdd:
		req.MemberID = r.u64("member id")
		req.ConsensusAddr = string(r.bytes16("consensus addr", AddrBytesMax))
		req.ClientAddr = string(r.bytes16("client addr", AddrBytesMax))
		if r.err == nil && (req.ConsensusAddr == "" || req.ClientAddr == "") {
			r.fail("a member needs a consensus and a client address")
		}
	case OpMemberRemove, OpMemberPromote, OpTransferLeader:
		req.MemberID = r.u64("member id")
	}
	if r.err == nil && req.Op != OpMemberList && req.MemberID == 0 {
		r.fail("member id 0 is reserved")
	}
	if r.err == nil && req.MemberID > MemberIDMax {
		r.fail("member id %d is above %d (ids are 1..%d)", req.MemberID, MemberIDMax, MemberIDMax)
	}
}

func appendMembershipReply(b []byte, m *MembershipReply) []byte {
	if m == nil {
		m = &MembershipReply{}
	}
	b = binary.BigEndian.AppendUint64(b, m.Leader)
	b = binary.BigEndian.AppendUint64(b, m.Slot)
	var flags byte
	if m.Pending {
		flags |= membershipFlagPending
	}
	b = append(b, flags)
	members := m.Members
	if len(members) > MembershipMembersMax {
		members = members[:MembershipMembersMax]
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(members)))
	for _, mi := range members {
		b = binary.BigEndian.AppendUint64(b, mi.ID)
		var f byte
		if mi.Learner {
			f |= memberFlagLearner
		}
		commit := uint64(0)
		if mi.Tracked {
			f |= memberFlagTracked
			commit = mi.Commit
		}
		if mi.Reachable {
			f |= memberFlagReachable
		}
		b = append(b, f)
		b = binary.BigEndian.AppendUint64(b, commit)
		b = appendBytes16(b, clip(mi.ConsensusAddr, AddrBytesMax))
		b = appendBytes16(b, clip(mi.ClientAddr, AddrBytesMax))
	}
	return b
}

func readMembershipReply(r *reader) *MembershipReply {
	m := &MembershipReply{}
	m.Leader = r.u64("leader")
	m.Slot = r.u64("slot")
	flags := r.u8("flags")
	if r.err == nil && flags&^membershipFlagPending != 0 {
		r.fail("unknown membership flags %#x", flags)
	}
	m.Pending = flags&membershipFlagPending != 0
	n := int(r.u16("member count"))
	if r.err == nil && n > MembershipMembersMax {
		r.fail("%d members exceeds %d", n, MembershipMembersMax)
	}
	for i := 0; i < n && r.err == nil; i++ {
		var mi MemberInfo
		mi.ID = r.u64("member id")
		f := r.u8("member flags")
		if r.err == nil && f&^memberFlagsKnown != 0 {
			r.fail("member %d: unknown flags %#x", mi.ID, f)
		}
		mi.Learner, mi.Tracked, mi.Reachable = f&memberFlagLearner != 0, f&memberFlagTracked != 0, f&memberFlagReachable != 0
		mi.Commit = r.u64("member commit")
		if r.err == nil && !mi.Tracked && mi.Commit != 0 {
			r.fail("member %d: a commit index without tracking", mi.ID)
		}
		mi.ConsensusAddr = string(r.bytes16("consensus addr", AddrBytesMax))
		mi.ClientAddr = string(r.bytes16("client addr", AddrBytesMax))
		m.Members = append(m.Members, mi)
	}
	return m
}
