package client

import (
	"context"
	"errors"
	"fmt"
	"time"

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
	switch {
	case req.Op == proto.OpHello:
		return nil, errors.New("client: Forward of HELLO")
	case req.Op.IsWrite() && (req.ClientID == 0 || req.Seq == 0 || req.FirstUnacked == 0 || req.FirstUnacked > req.Seq):
		return nil, fmt.Errorf("%w: Forward of a %v without a valid write identity", ErrBadRequest, req.Op)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.RequestTimeout)
		defer cancel()
	}
	// The loop of do, except that a write's first unacked is the
	// caller's: do's comes from this client's own window, which a
	// forwarding client never uses.
	var lastErr error
	for attempt := 0; ; attempt++ {
		target := c.currentTarget()
		wait := time.Duration(0)
		cn, err := c.dial(ctx, target)
		var resp *proto.Response
		if err == nil {
			resp, err = cn.roundTrip(ctx, req)
		}
		switch {
		case ctx.Err() != nil:
			if lastErr != nil {
				return nil, fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
			}
			return nil, ctx.Err()
		case errors.Is(err, ErrClosed) || errors.Is(err, ErrUnauthorized):
			return nil, err
		case err != nil:
			c.redirect(target, "")
			wait = c.backoff(attempt)
			lastErr = err
		case resp.Status == proto.StatusNotLeader:
			lastErr = errorOf(resp)
			if resp.Leader != "" && resp.Leader != target {
				c.redirect(target, resp.Leader)
			} else {
				c.redirect(target, "")
				wait = c.backoff(attempt)
			}
		case resp.Status == proto.StatusThrottled:
			lastErr = errorOf(resp)
			wait = max(resp.RetryAfter, time.Microsecond)
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
				return nil, lastErr
			}
		case resp.Status == proto.StatusUnavailable:
			lastErr = errorOf(resp)
			wait = c.backoff(attempt)
		default:
			return resp, nil
		}
		if attempt >= c.opts.RetriesMax {
			return nil, lastErr
		}
		if wait > 0 {
			if err := c.opts.Sleep(ctx, wait); err != nil {
				return nil, fmt.Errorf("%w (last error: %v)", err, lastErr)
			}
		}
	}
}
