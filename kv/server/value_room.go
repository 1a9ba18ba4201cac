package server

import (
	"context"

	"synod/kv/proto"
)

// Value room. A GET reserves only a small answer before it runs (its value
// size is unknown until it is read); the answer is charged its real size
// when it is sent, and replaced by THROTTLED when the budgets have no room.
// But the value had been copied by then: 256 pipelined GETs of a megabyte
// per connection, whose answers were not read, copied 256 MiB each before
// being refused (an outside tester: six such connections took a leader to
// 1.3 GiB, past its 1 GiB budget, and cost a leader change). So the server
// puts a room check in a GET's context, and a backend that reads a value
// calls it with the value's length before it copies the value: the answer's
// room is taken from the connection's, tenant's and node's response budgets
// then, or the answer is THROTTLED with nothing copied.

type valueRoomKey struct{}

// A SCAN's answer is charged the same way, pair by pair: the backend
// calls the check before it copies each pair, with the answer's pair bytes
// so far (kv/sm ScanPairBytes summed), and ends the page before the pair
// refused. A SCAN used to reserve the largest answer its limit allowed
// before it ran, 3.15 MB for a thousand pairs however small they were: a
// tenant's SCANs of tiny keys were shortened, down to pages of two keys
// beside the tenant's unread answers (an outside tester), for room they
// would never use.

// ValueRoom returns the room check of a request's context (nil: none, as
// outside the server): called with a GET's value length (once, or twice
// when the store remembers a large value's length: first with that,
// before the value is read, then with the length read), or a SCAN's pair
// bytes so far, before they are copied, it returns nil when the answer
// fits the response budgets (they then hold it), else the answer to send
// instead (for a SCAN, only when the first pair is refused; a later
// refusal ends the page, More set).
func ValueRoom(ctx context.Context) func(n int) *proto.Response {
	f, _ := ctx.Value(valueRoomKey{}).(func(int) *proto.Response)
	return f
}

// WithRoom returns ctx carrying room as its room check (ValueRoom), for a
// caller that drives a Backend without this server (a backend's tests).
func WithRoom(ctx context.Context, room func(n int) *proto.Response) context.Context {
	return context.WithValue(ctx, valueRoomKey{}, room)
}

// getAnswerBytesMax bounds the encoded answer around a value of n bytes,
// or around n pair bytes of a SCAN (a SCAN answer's count and More flag
// fit the same overhead); responseBytesHint starts from it.
func getAnswerBytesMax(n int) int64 { return int64(getAnswerOverheadBytes + n) }

// getAnswerOverheadBytes bounds a GET answer's bytes around its value.
const getAnswerOverheadBytes = proto.HeaderBytes + 64

// A SCAN answer's header, pair count and More flag fit a GET answer's
// overhead, so getAnswerBytesMax bounds both.
var _ [getAnswerOverheadBytes - (proto.HeaderBytes + 4 + 1)]struct{}

// scanRoomStepBytes is how far ahead a SCAN's room check charges when it
// must charge: a thousand small pairs would otherwise each charge three
// budgets. Charged ahead only when the budgets have room for it (else the
// pair's exact need); what the answer does not use is given back when it
// is queued (send).
const scanRoomStepBytes = 32 << 10

// withValueRoom returns ctx with op's room check when op is a GET or a
// SCAN (ctx as it is for any other op), charging c's budgets beyond *held
// (which it raises to what it charged).
// A refusal is counted THROTTLED only when it is the answer: a GET's, or
// a SCAN's first pair's (the check is called once per pair, in order; a
// later pair's refusal ends the page). Not safe for concurrent calls:
// called on the request's own goroutine, or on another while the request
// waits for it with a happens-before edge both ways (a RESP follower's
// forwarded GET: kv/client's reader asks it under its connection's lock).
func (c *conn) withValueRoom(ctx context.Context, held *int64, op proto.Opcode) context.Context {
	if op != proto.OpGet && op != proto.OpScan {
		return ctx
	}
	calls := 0
	return context.WithValue(ctx, valueRoomKey{}, func(n int) *proto.Response {
		calls++
		need := getAnswerBytesMax(n)
		if need <= *held {
			return nil
		}
		if op == proto.OpScan {
			ahead := min((need+scanRoomStepBytes-1)/scanRoomStepBytes*scanRoomStepBytes, scanResponseBytesMax)
			if ahead > need && c.tryCharge(ahead-*held) {
				*held = ahead
				return nil
			}
		}
		full := c.tryChargeOrFull(need - *held)
		if full == budgetNone {
			*held = need
			return nil
		}
		var r *proto.Response
		switch {
		case op != proto.OpScan:
			r = proto.Errorf(proto.StatusThrottled, "a GET answer of %d bytes %s", need, full.refusal())
		case calls == 1:
			r = proto.Errorf(proto.StatusThrottled, "no room for a SCAN answer of even its first pair (%d bytes of key and value, an answer of up to %d bytes): it %s",
				n-scanPairPrefixBytes, need, full.refusal())
		default:
			return scanPageEnds // not the answer: not counted
		}
		c.countThrottled()
		r.RetryAfter = budgetRetryAfter
		return r
	})
}

// scanPairPrefixBytes is what a pair adds to a SCAN answer beyond its key
// and value: their length prefixes (kv/sm ScanPairBytes).
const scanPairPrefixBytes = 2 + 4

// scanPageEnds is a SCAN room check's refusal of a pair after the first:
// the backend ends the page before it, and it is never sent.
var scanPageEnds = proto.Errorf(proto.StatusThrottled, "the SCAN page ends here")

// budgetFull names the response budget that had no room for an answer.
type budgetFull int

const (
	budgetNone   budgetFull = iota // charged
	budgetConn                     // response_bytes_per_conn_max
	budgetTenant                   // response_bytes_per_tenant_max
	budgetNode                     // response_bytes_per_node_max
)

// refusal completes a THROTTLED message ("a GET answer of N bytes ...")
// with the budget that is full and what frees it: a client told to read
// its answers when other tenants' unread answers fill the node would look
// for a fault it does not have (an outside tester's well-behaved reader
// got exactly that).
func (f budgetFull) refusal() string {
	switch f {
	case budgetConn:
		return "does not fit the connection's response budget (response_bytes_per_conn_max): read the connection's answers"
	case budgetTenant:
		return "does not fit the tenant's response budget (response_bytes_per_tenant_max): the tenant's connections hold unread answers"
	default:
		return "does not fit the node's response budget (response_bytes_per_node_max): other tenants' answers wait to be read; retry"
	}
}
