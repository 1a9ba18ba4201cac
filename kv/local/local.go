// Package local is a single-node server.Backend that applies writes straight
// to a state machine, with no consensus: every write is its own slot,
// committed when Apply returns. It serves tests, examples and the client
// library's documentation; it is not durable beyond what sm.Flush makes
// durable, since there is no log to replay.
package local

import (
	"context"
	"sync"

	"synod/kv/proto"
	"synod/kv/server"
	"synod/kv/sm"
	"synod/tenants"
)

// Backend applies requests to one state machine.
type Backend struct {
	sm   *sm.SM
	addr string

	mu sync.Mutex // serialises slot assignment and Apply
}

var _ server.Backend = (*Backend)(nil)

// New returns a backend on s. addr is reported as this node's (and the
// leader's) client address in STATUS replies.
func New(s *sm.SM, addr string) *Backend { return &Backend{sm: s, addr: addr} }

// Do implements server.Backend.
func (b *Backend) Do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
	if err := ctx.Err(); err != nil {
		return proto.Errorf(proto.StatusUnavailable, "%v", err)
	}
	switch req.Op {
	case proto.OpGet, proto.OpScan:
		return b.sm.ReadResponseWithin(ctx, tenant, req, server.ValueRoom(ctx))
	case proto.OpStatus:
		applied := b.sm.Applied()
		return &proto.Response{Cluster: &proto.ClusterStatus{
			Self: 1, LeaderID: 1, LeaderAddr: b.addr, Ballot: proto.Ballot{Round: 1, Node: 1},
			Members: []proto.MemberStatus{{ID: 1, Addr: b.addr, Role: proto.RoleLeader,
				Ballot: proto.Ballot{Round: 1, Node: 1}, Commit: applied, Applied: applied, Reachable: true,
				// One node: it knows everything about itself.
				Known: proto.KnownRole | proto.KnownCommit | proto.KnownApplied | proto.KnownReachable |
					proto.KnownAcked | proto.KnownHeard | proto.KnownLag, Acked: applied}},
			Extended: req.StatusFormat >= proto.StatusFormatProgress,
		}}
	case proto.OpPut, proto.OpDelete, proto.OpCAS, proto.OpBatch:
		cmd := sm.EncodeCommand(tenant, req)
		b.mu.Lock()
		res, err := b.sm.Apply(b.sm.Applied()+1, [][]byte{cmd})
		b.mu.Unlock()
		if err != nil {
			return proto.Errorf(proto.StatusInternal, "%v", err)
		}
		return res[0].Response(req)
	case proto.OpPing:
		return &proto.Response{}
	}
	return proto.Errorf(proto.StatusBadRequest, "opcode %v not served", req.Op)
}
