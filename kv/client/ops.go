package client

import (
	"context"

	"synod/kv/proto"
)

// Get returns key's value, or an error matching ErrNotFound.
func (c *Client) Get(ctx context.Context, key []byte) ([]byte, error) {
	return c.get(ctx, key, 0)
}

// GetStale is Get that any replica may answer from its applied state,
// without the linearizable read path: it may miss recent writes.
func (c *Client) GetStale(ctx context.Context, key []byte) ([]byte, error) {
	return c.get(ctx, key, proto.FlagStaleOK)
}

func (c *Client) get(ctx context.Context, key []byte, flags proto.Flags) ([]byte, error) {
	resp, err := c.do(ctx, &proto.Request{Op: proto.OpGet, Flags: flags, Key: key})
	if err != nil {
		return nil, err
	}
	if err := errorOf(resp); err != nil {
		return nil, err
	}
	return resp.Value, nil
}

// Put stores value under key.
func (c *Client) Put(ctx context.Context, key, value []byte) error {
	return c.simpleWrite(ctx, &proto.Request{Op: proto.OpPut, Key: key, Value: value})
}

// Delete removes key; deleting an absent key succeeds.
func (c *Client) Delete(ctx context.Context, key []byte) error {
	return c.simpleWrite(ctx, &proto.Request{Op: proto.OpDelete, Key: key})
}

// CAS stores value under key if key's current value equals expect; a nil
// expect means "key must be absent" (an empty non-nil slice expects a
// present, empty value). A failed compare returns a *StatusError matching
// ErrCASMismatch whose Current holds the current value when known.
func (c *Client) CAS(ctx context.Context, key, expect, value []byte) error {
	return c.simpleWrite(ctx, &proto.Request{Op: proto.OpCAS, Key: key, Value: value,
		ExpectPresent: expect != nil, Expect: expect})
}

// Batch applies ops atomically: all or none. A failed CAS among them
// returns a *StatusError matching ErrCASMismatch whose FailedOp is its
// index. At most proto.BatchOpsMax operations.
func (c *Client) Batch(ctx context.Context, ops []proto.BatchOp) error {
	return c.simpleWrite(ctx, &proto.Request{Op: proto.OpBatch, Ops: ops})
}

func (c *Client) simpleWrite(ctx context.Context, req *proto.Request) error {
	resp, err := c.write(ctx, req)
	if err != nil {
		return err
	}
	return errorOf(resp)
}

// Scan returns up to limit pairs with start <= key < end (empty end: to
// the end of the tenant's keys), in key order. more reports that the scan
// stopped early; continue from the last key + "\x00". limit is clamped to
// 1..proto.ScanLimitMax.
func (c *Client) Scan(ctx context.Context, start, end []byte, limit int) (pairs []proto.KV, more bool, err error) {
	limit = max(1, min(limit, proto.ScanLimitMax))
	resp, err := c.do(ctx, &proto.Request{Op: proto.OpScan, Start: start, End: end, Limit: uint32(limit)})
	if err != nil {
		return nil, false, err
	}
	if err := errorOf(resp); err != nil {
		return nil, false, err
	}
	return resp.Pairs, resp.More, nil
}

// Status returns the cluster status as seen by the current target server,
// with the progress extension (proto.StatusFormatProgress: which figures
// of each row the server knows, and the leader's view of its followers)
// when the server has it.
func (c *Client) Status(ctx context.Context) (*proto.ClusterStatus, error) {
	resp, err := c.do(ctx, &proto.Request{Op: proto.OpStatus, StatusFormat: proto.StatusFormatProgress})
	if err == nil && resp.Status == proto.StatusBadRequest {
		// A server from before the extension: ask for the basic reply.
		resp, err = c.do(ctx, &proto.Request{Op: proto.OpStatus})
	}
	if err != nil {
		return nil, err
	}
	if err := errorOf(resp); err != nil {
		return nil, err
	}
	return resp.Cluster, nil
}

// StatusAt asks one server, addr, for its view, without redirects or
// retries (kvctl status uses it to show every member's own figures). Like
// Status, it asks for the progress extension first.
func (c *Client) StatusAt(ctx context.Context, addr string) (*proto.ClusterStatus, error) {
	cn, err := c.connTo(ctx, addr)
	if err != nil {
		return nil, err
	}
	resp, err := cn.roundTrip(ctx, &proto.Request{Op: proto.OpStatus, StatusFormat: proto.StatusFormatProgress})
	if err == nil && resp.Status == proto.StatusBadRequest {
		resp, err = cn.roundTrip(ctx, &proto.Request{Op: proto.OpStatus})
	}
	if err != nil {
		return nil, err
	}
	if err := errorOf(resp); err != nil {
		return nil, err
	}
	return resp.Cluster, nil
}

// Ping checks that the current target answers.
func (c *Client) Ping(ctx context.Context) error {
	resp, err := c.do(ctx, &proto.Request{Op: proto.OpPing})
	if err != nil {
		return err
	}
	return errorOf(resp)
}
