package server

import (
	"context"
	"time"

	"synod/kv/proto"
)

// Request budgets. A request's body is held from the moment it is read
// until the request is answered (Backend.Do returned), and on its way into
// consensus it is copied several times (the command, its envelope, the
// accept messages): bodies in flight are what a pipelining writer makes a
// node hold. They are bounded like the response bytes, at three levels:
//
//   - per connection (Config.RequestBytesPerConnMax): a frame whose body
//     does not fit waits before its body is read, so a connection
//     pipelining large writes is slowed by TCP back-pressure, not refused;
//   - per tenant (RequestBytesPerTenantMax): a frame whose body does not
//     fit waits, unread, for the tenant's other requests to give bytes
//     back, at most requestTenantWaitMax; only then is it answered
//     THROTTLED with a retry-after, its body read and dropped. Waiting
//     holds back that tenant's connection only (no other tenant's bytes
//     are held by it), and keeps a tenant pipelining large writes on
//     several connections from sending bodies only to have them dropped
//     (an outside tester measured 44 % less written with four
//     connections than with one when every such frame was THROTTLED at
//     once and retried after 10 ms);
//   - per node (RequestBytesPerNodeMax): a frame whose body does not fit is
//     answered THROTTLED at once, body read and dropped: waiting here
//     would let one tenant's writes make other tenants' requests wait. A
//     quarter of it is a reserve for tenants holding little
//     (node_reserve.go).
//
// Invariant: the bytes charged at each level are the bodies of requests
// read and not yet answered; every path that ends a request gives its
// bytes back (releaseRequest).

// RequestBytesPerConnMin is the least RequestBytesPerConnMax: one request
// of the largest body.
const RequestBytesPerConnMin = proto.RequestBodyBytesMax

// requestTenantWaitMax bounds how long a frame waits for room in its
// tenant's request budget before it is answered THROTTLED: several
// megabyte writes' commit time, far below any client's request timeout.
const requestTenantWaitMax = time.Second

// requestBudgetRetryAfter is the retry-after of a THROTTLED for request
// bytes: about the time a write of a megabyte takes to commit.
const requestBudgetRetryAfter = budgetRetryAfter

// chargeRequest takes n body bytes (at most the connection's budget:
// callers clamp) at every level: it waits for the connection's own room,
// then for the tenant's at most requestTenantWaitMax, then takes the
// node's room if there is some (waited reports that it had to wait).
// full names the budget without room (nothing held) when the tenant's
// wait ran out or the node had none; ok is false and full budgetNone
// (nothing held) when the connection ended while it waited.
func (c *conn) chargeRequest(n int64) (ok bool, full budgetFull, waited bool) {
	if !c.reqQueued.tryAdd(n) {
		waited = true
		if !c.reqQueued.wait(c.ctx, n) {
			return false, budgetNone, waited
		}
	}
	if !c.reqTenant.tryAdd(n) {
		waited = true
		ctx, cancel := context.WithTimeout(c.ctx, requestTenantWaitMax)
		room := c.reqTenant.wait(ctx, n)
		cancel()
		if !room {
			c.reqQueued.release(n)
			if c.ctx.Err() != nil {
				return false, budgetNone, waited
			}
			return false, budgetTenant, waited
		}
	}
	if !c.s.reqNode.tryAddWithin(n, c.reqNodeLimit()) {
		c.reqTenant.release(n)
		c.reqQueued.release(n)
		return false, budgetNode, waited
	}
	c.s.noteHeavy(c.reqTenant, tenantLightRequestBytes)
	return true, budgetNone, waited
}

// releaseRequest gives back n body bytes at every level.
func (c *conn) releaseRequest(n int64) {
	c.s.noteHeavy(c.reqTenant, tenantLightRequestBytes)
	c.s.reqNode.release(n)
	c.reqTenant.release(n)
	c.reqQueued.release(n)
}

// requestThrottled is the answer to a frame whose body finds no room in
// the tenant's or the node's request budget (full), naming which.
func requestThrottled(h proto.Header, n int64, full budgetFull) *proto.Response {
	why := "the tenant's request budget (request_bytes_per_tenant_max): the tenant's writes in flight hold it"
	if full == budgetNode {
		why = "the node's request budget (request_bytes_per_node_max): other tenants' writes in flight hold it"
	}
	resp := proto.Errorf(proto.StatusThrottled, "no room for a request body of %d bytes in %s; retry", n, why)
	resp.Op, resp.ID, resp.RetryAfter = h.Op, h.ID, requestBudgetRetryAfter
	return resp
}
