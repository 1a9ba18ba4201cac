package proto

import (
	"encoding/binary"
	"fmt"
	"time"

	"synod/tenants"
)

// Response is a decoded server response. Status decides the body: OK
// carries the opcode's result; every other status carries the error body
// (RetryAfter, FailedOp, Value when HasValue, Leader, Message).
type Response struct {
	Op     Opcode
	Status Status
	Tenant tenants.ID // HELLO: the tenant the token authenticated
	ID     uint64

	// HELLO (OK): the server's protocol version and limits.
	Version            uint16
	InflightPerConnMax uint32
	FrameBytesMax      uint32

	// GET (OK); CAS_MISMATCH when HasValue: the current value.
	Value    []byte
	HasValue bool

	// SCAN (OK). More means the scan stopped at Limit or ScanReplyBytesMax
	// and more keys may follow the last one returned.
	Pairs []KV
	More  bool

	// STATUS (OK)
	Cluster *ClusterStatus

	// Membership operations (OK, member.go)
	Membership *MembershipReply

	// Error body.
	RetryAfter time.Duration // THROTTLED: wait at least this long (microsecond resolution)
	FailedOp   uint32        // BATCH CAS_MISMATCH: index of the first failing operation
	Leader     string        // NOT_LEADER: the leader's client address when known
	Message    string        // human-readable detail
}

// KV is one scan result.
type KV struct {
	Key, Value []byte
}

// Ballot mirrors paxos.Ballot on the wire: rounds compare first, then nodes.
type Ballot struct {
	Round uint64
	Node  uint64
}

// Role is a member's role in a STATUS reply.
type Role uint8

const (
	RoleUnknown   Role = 0 // not reachable, or not reported
	RoleFollower  Role = 1
	RoleCandidate Role = 2
	RoleLeader    Role = 3
	// RoleLearner: a learner (it receives the log, does not vote). Older
	// decoders refuse it; a reply shows it only for a cluster with
	// learners.
	RoleLearner Role = 4
)

func (r Role) String() string {
	switch r {
	case RoleFollower:
		return "follower"
	case RoleCandidate:
		return "candidate"
	case RoleLeader:
		return "leader"
	case RoleLearner:
		return "learner"
	}
	return "unknown"
}

// ClusterStatus is the reply to STATUS: the answering node's view.
type ClusterStatus struct {
	Self       uint64 // node id of the member that answered
	LeaderID   uint64 // 0 when unknown
	LeaderAddr string // client address of the leader, when known
	Ballot     Ballot // highest ballot the answering node knows
	Members    []MemberStatus
	// Extended says the reply carries the progress extension (STATUS
	// format StatusFormatProgress, status_ext.go): each row's Known bits
	// and the figures below Reachable. Without it those are zero and a
	// row's unknown figures are zero too.
	Extended bool
}

// MemberStatus is one member's figures as known to the answering node.
type MemberStatus struct {
	ID        uint64
	Addr      string // client address
	Role      Role
	Ballot    Ballot
	Commit    uint64 // highest slot known committed
	Applied   uint64 // highest slot applied to the state machine
	Reachable bool

	// The progress extension (Extended replies only).
	Known Known // which figures of this row the answering node knows
	// Acked is the highest slot the member is known to hold (the
	// leader's view of a follower).
	Acked uint64
	// HeardAgo is how long before the reply the answering node last
	// heard from the member (millisecond resolution).
	HeardAgo time.Duration
	// Lag is how long ago the leader's commit index passed the member's
	// Commit (0: caught up, or within a heartbeat period); with
	// LagAtLeast the leader's history does not reach back that far and
	// Lag is a lower bound.
	Lag        time.Duration
	LagAtLeast bool
}

// Errorf returns a response with status st and a formatted message.
func Errorf(st Status, format string, args ...any) *Response {
	msg := fmt.Sprintf(format, args...)
	if len(msg) > MessageBytesMax {
		msg = msg[:MessageBytesMax]
	}
	return &Response{Status: st, Message: msg}
}

// AppendResponse appends the complete frame (header and body) for resp.
// Fields over their wire limits (Message, Leader, member addresses) are
// truncated rather than producing an undecodable frame.
func AppendResponse(b []byte, resp *Response) []byte {
	start := len(b)
	b = AppendHeader(b, Header{Op: resp.Op, Flags: FlagResponse, Status: resp.Status, Tenant: resp.Tenant, ID: resp.ID})
	if resp.Status != StatusOK {
		us := resp.RetryAfter.Microseconds()
		if us < 0 {
			us = 0
		}
		b = binary.BigEndian.AppendUint64(b, uint64(us))
		b = binary.BigEndian.AppendUint32(b, resp.FailedOp)
		b = appendBool(b, resp.HasValue)
		b = appendBytes32(b, resp.Value)
		b = appendBytes16(b, clip(resp.Leader, AddrBytesMax))
		b = appendBytes16(b, clip(resp.Message, MessageBytesMax))
	} else {
		switch resp.Op {
		case OpHello:
			b = binary.BigEndian.AppendUint16(b, resp.Version)
			b = binary.BigEndian.AppendUint32(b, resp.InflightPerConnMax)
			b = binary.BigEndian.AppendUint32(b, resp.FrameBytesMax)
		case OpGet:
			b = appendBytes32(b, resp.Value)
		case OpScan:
			b = binary.BigEndian.AppendUint32(b, uint32(len(resp.Pairs)))
			for _, kv := range resp.Pairs {
				b = appendBytes16(b, kv.Key)
				b = appendBytes32(b, kv.Value)
			}
			b = appendBool(b, resp.More)
		case OpStatus:
			cs := resp.Cluster
			if cs == nil {
				cs = &ClusterStatus{}
			}
			b = binary.BigEndian.AppendUint64(b, cs.Self)
			b = binary.BigEndian.AppendUint64(b, cs.LeaderID)
			b = appendBytes16(b, clip(cs.LeaderAddr, AddrBytesMax))
			b = appendBallot(b, cs.Ballot)
			members := cs.Members
			if len(members) > MembersMax {
				members = members[:MembersMax]
			}
			if cs.Extended {
				members = maskUnknown(members) // never a guess for an unknown figure
			}
			b = binary.BigEndian.AppendUint16(b, uint16(len(members)))
			for _, m := range members {
				b = binary.BigEndian.AppendUint64(b, m.ID)
				b = appendBytes16(b, clip(m.Addr, AddrBytesMax))
				b = append(b, byte(m.Role))
				b = appendBallot(b, m.Ballot)
				b = binary.BigEndian.AppendUint64(b, m.Commit)
				b = binary.BigEndian.AppendUint64(b, m.Applied)
				b = appendBool(b, m.Reachable)
			}
			if cs.Extended {
				b = appendStatusExt(b, members)
			}
		case OpMemberList, OpMemberAdd, OpMemberRemove, OpMemberPromote, OpTransferLeader:
			b = appendMembershipReply(b, resp.Membership)
		}
	}
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-HeaderBytes))
	return b
}

func clip(s string, n int) []byte {
	if len(s) > n {
		s = s[:n]
	}
	return []byte(s)
}

func appendBallot(b []byte, bl Ballot) []byte {
	b = binary.BigEndian.AppendUint64(b, bl.Round)
	return binary.BigEndian.AppendUint64(b, bl.Node)
}

// DecodeResponse decodes a response body for header h. Byte slices alias
// body.
func DecodeResponse(h Header, body []byte) (*Response, error) {
	if h.Flags != FlagResponse {
		return nil, fmt.Errorf("%w: response flags %#x, want exactly the response flag", ErrMalformed, h.Flags)
	}
	if h.Op == OpNone && h.Status == StatusOK {
		return nil, fmt.Errorf("%w: OK response without an opcode", ErrMalformed)
	}
	resp := &Response{Op: h.Op, Status: h.Status, Tenant: h.Tenant, ID: h.ID}
	r := &reader{b: body}
	if h.Status != StatusOK {
		us := r.u64("retry after")
		if us > uint64(time.Hour/time.Microsecond) {
			r.fail("retry after %d us exceeds an hour", us)
		}
		resp.RetryAfter = time.Duration(us) * time.Microsecond
		resp.FailedOp = r.u32("failed op")
		resp.HasValue = r.boolean("has value")
		resp.Value = r.bytes32("value", ValueBytesMax)
		resp.Leader = string(r.bytes16("leader", AddrBytesMax))
		resp.Message = string(r.bytes16("message", MessageBytesMax))
	} else {
		switch h.Op {
		case OpHello:
			resp.Version = r.u16("version")
			resp.InflightPerConnMax = r.u32("inflight max")
			resp.FrameBytesMax = r.u32("frame bytes max")
		case OpGet:
			resp.Value = r.bytes32("value", ValueBytesMax)
			resp.HasValue = r.err == nil
		case OpScan:
			n := r.u32("pair count")
			if r.err == nil && n > ScanLimitMax {
				r.fail("%d pairs exceeds %d", n, ScanLimitMax)
			}
			for i := uint32(0); i < n && r.err == nil; i++ {
				k := r.bytes16("key", KeyBytesMax)
				v := r.bytes32("value", ValueBytesMax)
				resp.Pairs = append(resp.Pairs, KV{Key: k, Value: v})
			}
			resp.More = r.boolean("more")
		case OpStatus:
			cs := &ClusterStatus{}
			cs.Self = r.u64("self")
			cs.LeaderID = r.u64("leader id")
			cs.LeaderAddr = string(r.bytes16("leader addr", AddrBytesMax))
			cs.Ballot = readBallot(r)
			n := int(r.u16("member count"))
			if r.err == nil && n > MembersMax {
				r.fail("%d members exceeds %d", n, MembersMax)
			}
			for i := 0; i < n && r.err == nil; i++ {
				var m MemberStatus
				m.ID = r.u64("member id")
				m.Addr = string(r.bytes16("member addr", AddrBytesMax))
				m.Role = Role(r.u8("role"))
				if r.err == nil && m.Role > RoleLearner {
					r.fail("unknown role %d", m.Role)
				}
				m.Ballot = readBallot(r)
				m.Commit = r.u64("commit")
				m.Applied = r.u64("applied")
				m.Reachable = r.boolean("reachable")
				cs.Members = append(cs.Members, m)
			}
			readStatusExt(r, cs) // when the reply carries it
			resp.Cluster = cs
		case OpMemberList, OpMemberAdd, OpMemberRemove, OpMemberPromote, OpTransferLeader:
			resp.Membership = readMembershipReply(r)
		}
	}
	if err := r.done(); err != nil {
		return nil, fmt.Errorf("%v %v response body: %w", h.Op, h.Status, err)
	}
	return resp, nil
}

func readBallot(r *reader) Ballot {
	return Ballot{Round: r.u64("ballot round"), Node: r.u64("ballot node")}
}

// DecodeResponseFrame decodes one complete response frame from the start
// of b and returns it with the number of bytes used.
func DecodeResponseFrame(b []byte) (*Response, int, error) {
	h, err := DecodeHeader(b)
	if err != nil {
		return nil, 0, err
	}
	n := HeaderBytes + int(h.Length)
	if len(b) < n {
		return nil, 0, fmt.Errorf("%w: frame needs %d bytes, have %d", ErrMalformed, n, len(b))
	}
	resp, err := DecodeResponse(h, b[HeaderBytes:n])
	if err != nil {
		return nil, 0, err
	}
	return resp, n, nil
}
