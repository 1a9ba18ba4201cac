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
func getAnswerBytesMax(n int) int64 { return int64(proto.HeaderBytes + 64 + n) }

// withValueRoom returns ctx with a room check charging c's budgets beyond
// *held (which it raises to what it charged). Called on the request's own
// goroutine only.
func (c *conn) withValueRoom(ctx context.Context, held *int64) context.Context {
	return context.WithValue(ctx, valueRoomKey{}, func(valueBytes int) *proto.Response {
		need := getAnswerBytesMax(valueBytes)
		if need <= *held {
			return nil
		}
		if c.tryCharge(need - *held) {
			*held = need
			return nil
		}
		c.s.throttled.Add(1)
		r := proto.Errorf(proto.StatusThrottled, "a GET answer of %d bytes does not fit the response budget: read the connection's answers", need)
		r.RetryAfter = budgetRetryAfter
		return r
	})
}
