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

// ValueRoom returns the room check of a request's context (nil: none, as
// outside the server): called with a value's length before the value is
// copied, it returns nil when the answer fits the response budgets (they
// then hold it), else the answer to send instead.
func ValueRoom(ctx context.Context) func(valueBytes int) *proto.Response {
	f, _ := ctx.Value(valueRoomKey{}).(func(int) *proto.Response)
	return f
}

// getAnswerBytesMax bounds the encoded answer around a value of n bytes
// (responseBytesHint starts from it).
func getAnswerBytesMax(n int) int64 { return int64(getAnswerOverheadBytes + n) }

// getAnswerOverheadBytes bounds a GET answer's bytes around its value.
const getAnswerOverheadBytes = proto.HeaderBytes + 64

// withValueRoom returns ctx with a room check charging c's budgets beyond
// *held (which it raises to what it charged). Called on the request's own
// goroutine only.
func (c *conn) withValueRoom(ctx context.Context, held *int64) context.Context {
	return context.WithValue(ctx, valueRoomKey{}, func(valueBytes int) *proto.Response {
		need := getAnswerBytesMax(valueBytes)
		if need <= *held {
			return nil
		}
		full := c.tryChargeOrFull(need - *held)
		if full == budgetNone {
			*held = need
			return nil
		}
		c.countThrottled()
		r := proto.Errorf(proto.StatusThrottled, "a GET answer of %d bytes %s", need, full.refusal())
		r.RetryAfter = budgetRetryAfter
		return r
	})
}

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
