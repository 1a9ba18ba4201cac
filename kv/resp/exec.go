package resp

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"synod/kv/client"
	"synod/kv/proto"
	"synod/kv/server"
)

// exec is one command being executed: its arguments, its answer and the
// response budget it holds.
type exec struct {
	c    *conn
	ctx  context.Context
	w    *reply
	held int64
	cmd  *command
	// request: the command asked the backend (do), so its answer counts
	// in the connection's run of -BUSY answers (kv/server
	// refused_pace.go); a local command's (PING, an unknown command, a
	// syntax error) does not end one (a -BUSY one extends it).
	request bool
}

func (x *exec) args() [][]byte { return x.cmd.args }

// fits grows the command's budget to its answer so far; false when a
// budget has no room (the caller stops and answers busy()).
func (x *exec) fits() bool {
	n := int64(len(x.w.b))
	if n <= x.held {
		return true
	}
	if x.c.h.Fit(x.held, n) {
		x.held = n
		return true
	}
	x.c.h.Throttled()
	return false
}

// fitsMore is whether the answer so far and extra more bytes fit the
// command's budget, grown to them when they do (nothing counted when not:
// the caller answers something smaller).
func (x *exec) fitsMore(extra int64) bool {
	n := int64(len(x.w.b)) + extra
	if n <= x.held {
		return true
	}
	if x.c.h.Fit(x.held, n) {
		x.held = n
		return true
	}
	return false
}

// busy replaces the answer so far with a budget THROTTLED.
func (x *exec) busy() {
	n := int64(len(x.w.b))
	x.w.b = x.w.b[:0]
	x.fail(server.BudgetThrottled(n), false)
}

// fail answers resp (an error status) as a RESP error.
func (x *exec) fail(resp *proto.Response, write bool) {
	x.c.s.stats.errors.Add(1)
	x.w.err(errorText(resp, write))
}

// admitLocal admits a command that no backend request serves (PING,
// ECHO, CLIENT ...): one operation of the command's size, as the binary
// protocol admits a PING. false: refused (answered).
func (x *exec) admitLocal() bool {
	if r := x.c.h.Admit(&proto.Request{Op: proto.OpPing}, max(0, x.cmd.bytes-proto.HeaderBytes)); r != nil {
		x.fail(r, false)
		return false
	}
	return true
}

// do executes one backend request: admitted like a binary frame of the
// same request, served by this node, and forwarded to the leader when
// this node answers NOT_LEADER. A write gets the connection's next write
// identity first; a read is stale-ok on a READONLY connection.
func (x *exec) do(req *proto.Request) *proto.Response {
	c := x.c
	x.request = true
	req.Tenant = c.spec.ID
	if req.Op.IsWrite() {
		c.identify(req)
	}
	if c.readonly && (req.Op == proto.OpGet || req.Op == proto.OpScan) {
		req.Flags |= proto.FlagStaleOK
	}
	if r := checkRequest(req); r != nil {
		return r
	}
	if r := c.h.Admit(req, bodyBytes(req)); r != nil {
		return r
	}
	// A GET's value or a SCAN's pair is copied only once its answer has room.
	ctx := c.h.WithValueRoom(x.ctx, &x.held, req.Op)
	resp := c.s.be.Do(ctx, c.spec.ID, req)
	if resp == nil {
		return proto.Errorf(proto.StatusInternal, "backend returned no response")
	}
	if resp.Status == proto.StatusNotLeader && req.Op != proto.OpStatus {
		var room client.Room
		switch req.Op {
		case proto.OpScan:
			// Its reply comes back whole: reserve it first
			// (kv/server forwarded_scan.go).
			held, limit, refusal := c.h.ReserveForwardedScan(x.held, req.Limit)
			if x.held, req.Limit = held, limit; refusal != nil {
				return refusal
			}
		case proto.OpGet:
			// Charged as a GET served here is, before the value is
			// held: the answer's body length bounds the value's.
			room = client.Room(server.ValueRoom(ctx))
		}
		c.s.stats.proxied.Add(1)
		resp = c.s.proxy.forward(x.ctx, c.spec, resp.Leader, req, room)
	}
	return resp
}

// identify gives a write the connection's next write identity. One
// command runs at a time per connection, so a write's FirstUnacked is
// its own sequence: every earlier write of the connection has its answer.
func (c *conn) identify(req *proto.Request) {
	for c.writeID == 0 {
		var b [8]byte
		rand.Read(b[:])
		c.writeID = binary.BigEndian.Uint64(b[:])
	}
	c.writeSeq++
	req.ClientID, req.Seq, req.FirstUnacked = c.writeID, c.writeSeq, c.writeSeq
}

// bodyBytes is the size of req's binary-protocol body
// (len(proto.AppendRequestBody(nil, req)), without building it): what
// the shaper and the size limits count.
func bodyBytes(req *proto.Request) int {
	const writeID = 24
	keyOp := func(op proto.Opcode, key, value, expect []byte) int {
		n := 2 + len(key)
		switch op {
		case proto.OpPut:
			n += 4 + len(value)
		case proto.OpCAS:
			n += 1 + 4 + len(expect) + 4 + len(value)
		}
		return n
	}
	switch req.Op {
	case proto.OpGet:
		return 2 + len(req.Key)
	case proto.OpPut, proto.OpDelete, proto.OpCAS:
		return writeID + keyOp(req.Op, req.Key, req.Value, req.Expect)
	case proto.OpScan:
		return 2 + len(req.Start) + 2 + len(req.End) + 4
	case proto.OpBatch:
		n := writeID + 2
		for i := range req.Ops {
			op := &req.Ops[i]
			n += 1 + keyOp(op.Op, op.Key, op.Value, op.Expect)
		}
		return n
	}
	return 0
}

// errorText is the RESP error for a non-OK status. THROTTLED is
// "BUSY retry-after-ms N"; a read that cannot be served now is
// "TRYAGAIN" (clients may retry it); a write that may or may not have
// been applied is "UNAVAILABLE" (a client retry may apply it twice); a
// write refused for space (NO_SPACE) is "OOM", as Redis past maxmemory.
func errorText(resp *proto.Response, write bool) string {
	msg := resp.Message
	switch resp.Status {
	case proto.StatusThrottled:
		ms := int64(math.Ceil(float64(resp.RetryAfter) / 1e6))
		return strings.TrimSpace(fmt.Sprintf("BUSY retry-after-ms %d %s", max(ms, 1), msg))
	case proto.StatusTooLarge:
		return "ERR too large: " + msg
	case proto.StatusBadRequest:
		return "ERR " + msg
	case proto.StatusUnauthorized:
		return "NOAUTH " + msg
	case proto.StatusNotLeader:
		return "TRYAGAIN no leader reachable: " + msg
	case proto.StatusUnavailable:
		if write {
			return "UNAVAILABLE " + msg + " (the write may or may not have been applied)"
		}
		return "TRYAGAIN " + msg
	case proto.StatusSequenceStale:
		return "ERR SEQUENCE_STALE " + msg
	case proto.StatusInternal:
		return "ERR INTERNAL " + msg
	case proto.StatusNoSpace:
		// Redis answers a write past maxmemory with OOM; clients know it.
		return "OOM " + msg
	}
	return fmt.Sprintf("ERR %v %s", resp.Status, msg)
}

// checkRequest checks what proto.DecodeRequest checks of a request a
// binary client sends: keys non-empty and within KeyBytesMax, values
// within ValueBytesMax (TOO_LARGE), a scan limit of 1..ScanLimitMax and a
// batch of 1..BatchOpsMax operations (BAD_REQUEST). The body's total size
// is Admit's check.
func checkRequest(req *proto.Request) *proto.Response {
	key := func(k []byte) *proto.Response {
		switch {
		case len(k) == 0:
			return proto.Errorf(proto.StatusBadRequest, "empty key: synod keys are 1 to %d bytes", proto.KeyBytesMax)
		case len(k) > proto.KeyBytesMax:
			return proto.Errorf(proto.StatusTooLarge, "key of %d bytes exceeds %d (KeyBytesMax)", len(k), proto.KeyBytesMax)
		}
		return nil
	}
	value := func(vs ...[]byte) *proto.Response {
		for _, v := range vs {
			if len(v) > proto.ValueBytesMax {
				return proto.Errorf(proto.StatusTooLarge, "value of %d bytes exceeds %d (ValueBytesMax)", len(v), proto.ValueBytesMax)
			}
		}
		return nil
	}
	switch req.Op {
	case proto.OpGet, proto.OpDelete:
		return key(req.Key)
	case proto.OpPut, proto.OpCAS:
		if r := key(req.Key); r != nil {
			return r
		}
		return value(req.Value, req.Expect)
	case proto.OpScan:
		if len(req.Start) > proto.KeyBytesMax || len(req.End) > proto.KeyBytesMax {
			return proto.Errorf(proto.StatusTooLarge, "scan bound over %d bytes (KeyBytesMax)", proto.KeyBytesMax)
		}
		if req.Limit == 0 || req.Limit > proto.ScanLimitMax {
			return proto.Errorf(proto.StatusBadRequest, "scan limit %d outside 1..%d", req.Limit, proto.ScanLimitMax)
		}
	case proto.OpBatch:
		if len(req.Ops) == 0 || len(req.Ops) > proto.BatchOpsMax {
			return proto.Errorf(proto.StatusBadRequest, "batch of %d operations outside 1..%d", len(req.Ops), proto.BatchOpsMax)
		}
		for i := range req.Ops {
			if r := key(req.Ops[i].Key); r != nil {
				return r
			}
			if r := value(req.Ops[i].Value, req.Ops[i].Expect); r != nil {
				return r
			}
		}
	}
	return nil
}
