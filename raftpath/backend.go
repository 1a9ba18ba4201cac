package raftpath

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/raft/v3"

	"synod/kv/proto"
	"synod/kv/server"
	"synod/kv/sm"
	"synod/tenants"
)

// busyRetryAfter is the retry-after sent with THROTTLED when a queue is
// full.
const busyRetryAfter = 2 * time.Millisecond

// Backend serves client requests on a Node: writes are answered once
// applied on the leader, GET and SCAN after a ReadIndex barrier unless
// FlagStaleOK.
type Backend struct {
	n *Node
	// Tenants, when set, receives each request's service time per
	// tenant, as the Paxos path's backend reports it (kv/replica
	// Backend), so the two paths' in-store latencies compare.
	Tenants *tenants.Metrics
}

var _ server.Backend = (*Backend)(nil)

// NewBackend returns the server.Backend of n.
func NewBackend(n *Node) *Backend { return &Backend{n: n} }

// Do implements server.Backend.
func (b *Backend) Do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
	start := time.Now()
	resp := b.do(ctx, tenant, req)
	b.Tenants.ObserveService(tenant, time.Since(start))
	return resp
}

func (b *Backend) do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
	switch req.Op {
	case proto.OpPut, proto.OpDelete, proto.OpCAS, proto.OpBatch:
		res, err := b.n.Write(ctx, sm.EncodeCommand(tenant, req))
		if err != nil {
			return errResponse(err)
		}
		return res.Response(req)
	case proto.OpGet, proto.OpScan:
		room := server.ValueRoom(ctx)
		if req.Flags&proto.FlagStaleOK == 0 {
			// A GET refused for room needs no barrier (kv/sm ReadRefusal);
			// a follower still answers NOT_LEADER first.
			if b.n.IsLeader() {
				if r := b.n.sm.ReadRefusal(ctx, tenant, req, room); r != nil {
					return r
				}
			}
			if err := b.n.ReadBarrier(ctx); err != nil {
				return errResponse(err)
			}
		}
		// Reads never overlap a restore: only the Ready loop restores, and
		// only on a follower (a leader is never sent a snapshot), while
		// linearizable reads are served by the leader. Stale reads on a
		// follower may see a restore in progress, as their flag allows.
		return b.n.sm.ReadResponseWithin(ctx, tenant, req, room)
	case proto.OpStatus:
		return &proto.Response{Cluster: b.clusterStatus()}
	case proto.OpPing:
		return &proto.Response{}
	}
	if req.Op.IsMember() {
		// The raft path's membership is its configured peers; the
		// membership operations (kvctl member) are paxos-path only.
		return proto.Errorf(proto.StatusBadRequest, "%v is not supported with replication = \"raft\" (membership is the configured peers)", req.Op)
	}
	return proto.Errorf(proto.StatusBadRequest, "opcode %v not served", req.Op)
}

func errResponse(err error) *proto.Response {
	var nl *NotLeaderError
	switch {
	case errors.As(err, &nl):
		r := proto.Errorf(proto.StatusNotLeader, "%v", err)
		r.Leader = nl.ClientAddr
		return r
	case errors.Is(err, ErrBusy):
		r := proto.Errorf(proto.StatusThrottled, "%v", err)
		r.RetryAfter = busyRetryAfter
		return r
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return proto.Errorf(proto.StatusUnavailable, "deadline passed; outcome unknown: %v", err)
	default:
		return proto.Errorf(proto.StatusUnavailable, "%v", err)
	}
}

// clusterStatus maps raft terms onto the protocol's ballots: Round is
// the term, Node the leader.
func (b *Backend) clusterStatus() *proto.ClusterStatus {
	s := b.n.Status()
	cs := &proto.ClusterStatus{Self: s.ID, LeaderID: s.Leader, Ballot: proto.Ballot{Round: s.Term, Node: s.Leader}}
	for _, p := range b.n.cfg.Peers {
		if p.ID == s.Leader {
			cs.LeaderAddr = p.ClientAddr
		}
		m := proto.MemberStatus{ID: p.ID, Addr: p.ClientAddr, Ballot: cs.Ballot}
		switch {
		case p.ID == s.ID:
			m.Role = roleOf(s.Role)
			m.Commit, m.Applied, m.Reachable = s.Commit, s.Applied, true
		case p.ID == s.Leader:
			m.Role, m.Reachable = proto.RoleLeader, true
		default:
			m.Role = proto.RoleFollower
		}
		if s.Match != nil && p.ID != s.ID {
			m.Commit, m.Reachable = s.Match[p.ID], s.Active[p.ID]
		}
		cs.Members = append(cs.Members, m)
	}
	return cs
}

func roleOf(st raft.StateType) proto.Role {
	switch st {
	case raft.StateLeader:
		return proto.RoleLeader
	case raft.StateCandidate, raft.StatePreCandidate:
		return proto.RoleCandidate
	}
	return proto.RoleFollower
}
