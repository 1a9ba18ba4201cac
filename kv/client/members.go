package client

import (
	"context"

	"synod/kv/proto"
)

// Membership operations (kv/proto member.go). Each takes the cluster's
// admin token (a node's [admin] token), not the tenant token the client
// connected with; only the leader executes them, and like any call they
// follow NOT_LEADER to it and retry UNAVAILABLE within the deadline. The
// server makes them idempotent (adding a learner that is already one with
// the same addresses, promoting a voter, removing a non-member, or
// transferring to the leader succeeds and changes nothing), so a retry
// after an unknown outcome is safe. A refusal because another change or a
// transfer is in progress, or because a learner has not caught up, matches
// ErrConflict: nothing was done. Each returns the membership after the
// operation, from the leader's view.

// Members returns the membership as the leader sees it.
func (c *Client) Members(ctx context.Context, adminToken string) (*proto.MembershipReply, error) {
	return c.member(ctx, &proto.Request{Op: proto.OpMemberList, AdminToken: adminToken})
}

// AddLearner adds node id as a learner: it receives the log but does not
// vote until PromoteMember. consensusAddr is its consensus address
// (ip:port), clientAddr where clients reach it.
func (c *Client) AddLearner(ctx context.Context, adminToken string, id uint64, consensusAddr, clientAddr string) (*proto.MembershipReply, error) {
	return c.member(ctx, &proto.Request{Op: proto.OpMemberAdd, AdminToken: adminToken, MemberID: id,
		ConsensusAddr: consensusAddr, ClientAddr: clientAddr})
}

// PromoteMember makes learner id a voter (refused, ErrConflict, while it
// lags the leader).
func (c *Client) PromoteMember(ctx context.Context, adminToken string, id uint64) (*proto.MembershipReply, error) {
	return c.member(ctx, &proto.Request{Op: proto.OpMemberPromote, AdminToken: adminToken, MemberID: id})
}

// RemoveMember takes voter or learner id out of the membership.
func (c *Client) RemoveMember(ctx context.Context, adminToken string, id uint64) (*proto.MembershipReply, error) {
	return c.member(ctx, &proto.Request{Op: proto.OpMemberRemove, AdminToken: adminToken, MemberID: id})
}

// TransferLeadership hands leadership to voter id and returns once it
// leads (the reply's Leader).
func (c *Client) TransferLeadership(ctx context.Context, adminToken string, id uint64) (*proto.MembershipReply, error) {
	return c.member(ctx, &proto.Request{Op: proto.OpTransferLeader, AdminToken: adminToken, MemberID: id})
}

func (c *Client) member(ctx context.Context, req *proto.Request) (*proto.MembershipReply, error) {
	resp, err := c.do(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := errorOf(resp); err != nil {
		return nil, err
	}
	return resp.Membership, nil
}
