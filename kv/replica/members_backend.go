package replica

import (
	"context"
	"errors"

	"synod/kv/proto"
	"synod/paxos"
)

// member serves a membership operation (members_ops.go; the server checked
// its admin token): the change, then the membership after it from this
// node's view. Followers answer NOT_LEADER with the leader's address.
func (b *Backend) member(ctx context.Context, req *proto.Request) *proto.Response {
	r := b.r
	id := paxos.NodeID(req.MemberID)
	var err error
	switch req.Op {
	case proto.OpMemberList:
		err = r.leaderOrHint()
	case proto.OpMemberAdd, proto.OpMemberPromote, proto.OpMemberRemove:
		err = r.ChangeMembership(ctx, MemberChange{Op: req.Op, ID: id, ConsensusAddr: req.ConsensusAddr, ClientAddr: req.ClientAddr})
	case proto.OpTransferLeader:
		err = r.TransferLeadership(ctx, id)
	}
	switch {
	case errors.Is(err, ErrMemberConflict):
		return proto.Errorf(proto.StatusConflict, "%v", err)
	case errors.Is(err, ErrMemberInvalid):
		return proto.Errorf(proto.StatusBadRequest, "%v", err)
	case err != nil:
		return b.errResponse(err)
	}
	return &proto.Response{Membership: b.membershipReply(ctx)}
}

// membershipReply is the committed membership with what this node knows of
// each member (the leader tracks every member's commit index).
func (b *Backend) membershipReply(ctx context.Context) *proto.MembershipReply {
	r := b.r
	s := r.Status()
	var peers []paxos.PeerProgress
	if s.Role == paxos.RoleLeader {
		if ps := r.peerProgress(ctx); ps != nil {
			peers, s = ps.peers, ps.status
		}
	}
	v := r.membersNow()
	out := &proto.MembershipReply{Leader: uint64(s.Leader), Slot: uint64(v.slot), Pending: v.pending || s.Transferring != 0}
	for _, m := range v.members {
		mi := proto.MemberInfo{ID: m.ID, Learner: m.Learner, ConsensusAddr: m.ConsensusAddr, ClientAddr: m.ClientAddr}
		if paxos.NodeID(m.ID) == r.cfg.ID && s.Role == paxos.RoleLeader {
			mi.Tracked, mi.Reachable, mi.Commit = true, true, uint64(s.Commit)
		}
		for _, pp := range peers {
			if uint64(pp.ID) == m.ID {
				// Tracked: its commit index is known (it answered
				// this leader), as in STATUS.
				mi.Tracked, mi.Commit = pp.Tracked && pp.Reported, uint64(pp.Commit)
				mi.Reachable = pp.Heard && pp.HeardAgoTicks < int64(r.cfg.ElectionTicks)
			}
		}
		out.Members = append(out.Members, mi)
	}
	return out
}
