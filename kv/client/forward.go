package client

import (
	"context"
	"errors"
	"fmt"

	"synod/kv/proto"
)

// Forward sends req as it is, with the client's redirects and retries,
// and returns the final response (OK or a status that retrying cannot
// change) or an error (ErrThrottled and ErrUnavailable among them when
// retries ran out). It is for a proxy that relays requests it received
// elsewhere (kv/resp on a follower): a write keeps the caller's whole
// write identity (req.ClientID, req.Seq and req.FirstUnacked, which must
// be valid), so that the caller's own earlier attempt at the same write
// and every retry here are applied at most once between them. The write
// identities a proxy uses must not collide with the client's own
// (Forward never draws a sequence from the client's window), so use a
// client for Forward only or for its own calls only.
func (c *Client) Forward(ctx context.Context, req *proto.Request) (*proto.Response, error) {
	return c.ForwardWithin(ctx, req, nil)
}

// ForwardWithin is Forward that asks room, when set, before it reads an
// answer's body into memory (Room): a refusal is returned as the
// response, at once and without a retry, and the body is never held. A
// proxy whose answers count against budgets passes its own room check
// (kv/resp: a follower's forwarded GET is charged its value before the
// value is read, as a GET the node serves itself is).
func (c *Client) ForwardWithin(ctx context.Context, req *proto.Request, room Room) (*proto.Response, error) {
	switch {
	case req.Op == proto.OpHello:
		return nil, errors.New("client: Forward of HELLO")
	case req.Op.IsWrite() && (req.ClientID == 0 || req.Seq == 0 || req.Seq > proto.SeqMax || req.FirstUnacked == 0 || req.FirstUnacked > req.Seq):
		return nil, fmt.Errorf("%w: Forward of a %v without a valid write identity", ErrBadRequest, req.Op)
	}
	// do's loop, except that a write's first unacked is the caller's: do's
	// comes from this client's own window, which a forwarding client never
	// uses. The same rules hold: one connection per endpoint, shared by
	// every forwarded request, with per-endpoint back-off (endpoint.go).
	return c.retry(ctx, req, false, room)
}
