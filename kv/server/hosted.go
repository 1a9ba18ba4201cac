package server

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/proto"
	"synod/tenants"
)

// Hosted connections. A protocol other than the binary one (kv/resp, the
// Redis protocol) can be served on a listener of its own under this
// server's limits, so that a second port is not a second, unbounded way
// in:
//
//   - connection caps: a hosted connection sits in the same pre-HELLO
//     pool, counts against the same per-source cap and, once
//     authenticated, against the same per-tenant and node-wide caps as a
//     binary one (a node holds at most conns_max authenticated
//     connections of both protocols together);
//   - response budgets: the same per-connection, per-tenant and per-node
//     budgets, with the same reservation per request;
//   - admission: the same checks of the tenant's key, value and frame
//     limits and the same Admitter (shaper, overload guard);
//   - the rate-limited log, the counters and Close, which closes hosted
//     connections with the others and waits for them.
//
// The hosted protocol does its own framing and therefore applies the
// timeouts itself (Config gives them): handshake_timeout until it has
// authenticated, idle_timeout, frame_timeout and write_timeout as the
// binary protocol does.

// Hosted is one connection of a hosted protocol: its net.Conn and its
// share of the server's limits. Its methods are safe for concurrent use
// unless they say otherwise.
type Hosted struct{ c *conn }

// ServeHosted accepts connections on ln as Serve does, under the same
// caps, and runs serve for each admitted connection in a goroutine of its
// own. serve owns the connection until it returns, and must return soon
// after Context ends (an eviction, Close): then the connection's slots
// and whatever budget it still holds are given back. Close closes ln and
// every hosted connection and waits for every serve call to return. It
// takes ownership of ln and returns ErrServerClosed after Close.
func (s *Server) ServeHosted(ln net.Listener, serve func(*Hosted)) error {
	if serve == nil {
		panic("server: ServeHosted without a serve function")
	}
	return s.serve(ln, serve)
}

// runHosted runs serve for c, then closes c and gives back what it holds.
func (c *conn) runHosted(serve func(*Hosted)) {
	defer c.s.wg.Done()
	serve(&Hosted{c: c})
	c.close("hosted connection done")
	c.finish()
}

// Conn is the network connection (a *tls.Conn behind a TLS listener).
func (h *Hosted) Conn() net.Conn { return h.c.nc }

// Context ends when the connection is closed: by Close, by the server (an
// eviction to make room, Server.Close) or by a budget wait cut short.
func (h *Hosted) Context() context.Context { return h.c.ctx }

// Config is the server's configuration with its defaults filled in: the
// timeouts a hosted protocol applies (HandshakeTimeout, IdleTimeout,
// FrameTimeout, WriteTimeout, RequestTimeout).
func (h *Hosted) Config() Config { return h.c.s.cfg }

// Close closes the connection once; reason is logged at debug level.
func (h *Hosted) Close(reason string) { h.c.close(reason) }

// Logger is the connection's logger (remote address; tenant once
// authenticated).
func (h *Hosted) Logger() zerolog.Logger { return h.c.log }

// Warn and Notice return rate-limited log events (the server's shared
// limits on warnings and notices; nil, a disabled event, when over the
// rate).
func (h *Hosted) Warn() *zerolog.Event { return h.c.s.warnLog.event(h.c.log.Warn()) }

// Notice is Warn for per-request refusals (info level).
func (h *Hosted) Notice() *zerolog.Event { return h.c.s.noteLog.event(h.c.log.Info()) }

// Authenticate moves the connection from the pre-HELLO pool to spec's
// authenticated connections, as a binary HELLO does. It returns nil on
// success, or the refusal: THROTTLED (the tenant's connection cap, with a
// retry-after) or UNAVAILABLE (the node's cap, or the connection was
// evicted meanwhile). After a refusal the caller answers it and closes
// the connection. Authenticate is called at most once, by the goroutine
// that reads the connection, before any other method but Conn, Context,
// Config, Close and the loggers.
func (h *Hosted) Authenticate(spec tenants.Spec) *proto.Response {
	c := h.c
	resp, ok := c.s.promote(c, spec.ID)
	if !ok {
		if resp == nil {
			return proto.Errorf(proto.StatusUnavailable, "the connection was closed to make room before it authenticated")
		}
		c.s.warnLog.event(c.log.Warn()).Uint32("tenant", uint32(spec.ID)).Str("status", resp.Status.String()).
			Msg("connection refused: " + resp.Message)
		return resp
	}
	c.tenant, c.spec, c.tbudget, c.reqTenant = spec.ID, spec, c.s.tenants[spec.ID], c.s.reqTenants[spec.ID]
	c.tthrottled = c.s.tenantThrottled[spec.ID]
	c.frameBytesMax = proto.RequestFrameBytesMax
	if m := spec.FrameBytesMax(); m > 0 && m < int64(c.frameBytesMax) {
		c.frameBytesMax = int(m)
	}
	c.log = c.log.With().Uint32("tenant", uint32(spec.ID)).Logger()
	return nil
}

// ChargeRequest takes n bytes of a command read (its arguments) in the
// request budgets until ReleaseRequest gives them back (request_budget.go):
// it waits for the connection's own room (false, nil when the connection
// ended first: nothing is held), and answers THROTTLED (a non-nil
// response, nothing held) when the tenant's or the node's has none. A
// hosted protocol calls it once a command is read, before it reads the
// next, so what it reads ahead is bounded by the connection's budget and
// one command. A command larger than the connection's budget is charged
// the whole budget (charged is what ReleaseRequest must give back).
func (h *Hosted) ChargeRequest(n int64) (charged int64, ok bool, throttled *proto.Response) {
	n = min(n, h.c.reqQueued.max)
	ok, full, _ := h.c.chargeRequest(n)
	if full != budgetNone {
		h.c.countThrottled()
		resp := requestThrottled(proto.Header{}, n, full)
		resp.Tenant = h.c.tenant
		return 0, false, resp
	}
	if !ok {
		return 0, false, nil
	}
	return n, true, nil
}

// WithValueRoom returns ctx with a GET's or a SCAN's room check (ctx as
// it is for any other op; value_room.go): the backend asks it before it
// copies a value or a pair, and it charges this connection's response
// budgets beyond *held (raising *held to what it took), or returns the
// THROTTLED answer to give instead (a SCAN's page ends before a later
// pair refused). For the command's own goroutine only.
func (h *Hosted) WithValueRoom(ctx context.Context, held *int64, op proto.Opcode) context.Context {
	return h.c.withValueRoom(ctx, held, op)
}

// ReleaseRequest gives back what ChargeRequest took.
func (h *Hosted) ReleaseRequest(n int64) { h.c.releaseRequest(n) }

// Spec is the authenticated tenant's spec (zero before Authenticate).
func (h *Hosted) Spec() tenants.Spec { return h.c.spec }

// RequestBytesReserved is what Reserve takes: the room every request
// holds for its answer from before it is read.
const RequestBytesReserved = responseBytesReserved

// Reserve takes RequestBytesReserved of response budget for the next
// request before it is read, waiting until the connection's, tenant's
// and node's budgets have room (a client that does not read its answers
// is therefore no longer read). false: the connection ended first.
func (h *Hosted) Reserve() bool { return h.c.charge(responseBytesReserved) }

// Fit settles a request that holds held bytes on an answer of n bytes:
// it gives back held-n, or takes n-held more if every budget has room.
// false: no room (nothing changed; the caller answers with an error that
// fits in held, which any error of fewer than RequestBytesReserved does,
// and counts it with Throttled).
func (h *Hosted) Fit(held, n int64) bool {
	switch {
	case n > held:
		return h.c.tryCharge(n - held)
	case n < held:
		h.c.uncharge(held - n)
	}
	return true
}

// AnswerBytesMax is the largest answer this connection can ever be
// given: its own response budget (response_bytes_per_conn_max; the
// tenant's and the node's are at least as large). An answer larger than
// this is refused for good, not THROTTLED.
func (h *Hosted) AnswerBytesMax() int64 { return h.c.queued.max }

// Release gives back n bytes: an answer's once it is written, or a
// request's reservation when it is never answered.
func (h *Hosted) Release(n int64) { h.c.uncharge(n) }

// Throttled counts an answer refused for want of response budget
// (synod_client_responses_throttled_total).
func (h *Hosted) Throttled() { h.c.countThrottled() }

// Answered notes an answer of the hosted connection, THROTTLED (with its
// retry-after) or not, for pacing (refused_pace.go): a hosted protocol
// calls it for every answer, in order.
func (h *Hosted) Answered(throttled bool, retryAfter time.Duration) {
	h.c.refused.answered(throttled, retryAfter)
}

// WaitPace waits, before the hosted connection's next command runs, for
// as long as its run of THROTTLED answers asks (refused_pace.go); it
// returns at once when the connection is not paced, and early when the
// connection ends. The caller flushes its answers first. answeredAll
// says the command came once every earlier command of the connection
// had been answered (its answer handed to the kernel): a client that
// sent it after an admitted answer, which asks for no wait, is not held
// by its tenant's early frames' turns, as on the binary protocol.
func (h *Hosted) WaitPace(answeredAll bool) { h.c.waitPace(answeredAll) }

// Paced reports whether the next command would wait (WaitPace).
func (h *Hosted) Paced() bool { return h.c.refused.pace() > 0 }

// BudgetThrottled is the THROTTLED answer for a request whose answer does
// not fit the response budget, with the retry-after the binary protocol
// sends.
func BudgetThrottled(n int64) *proto.Response {
	r := proto.Errorf(proto.StatusThrottled, "a response of %d bytes does not fit the response budgets (the connection's, the tenant's or the node's): read the connection's answers, or retry", n)
	r.RetryAfter = budgetRetryAfter
	return r
}

// Admit checks one request of the authenticated tenant as the binary
// protocol checks a frame, in the same order: its body (bodyBytes, the
// size of its binary-protocol body) against RequestBodyBytesMax and the
// frame against the tenant's bytes_burst (TOO_LARGE), the Admitter
// (THROTTLED, with a retry-after of at least RetryAfterMin), and its keys
// and values against the tenant's own limits (TOO_LARGE). nil: admitted.
func (h *Hosted) Admit(req *proto.Request, bodyBytes int) *proto.Response {
	c := h.c
	frameBytes := proto.HeaderBytes + bodyBytes
	switch {
	case bodyBytes > proto.RequestBodyBytesMax:
		return proto.Errorf(proto.StatusTooLarge, "request body of %d bytes exceeds %d (RequestBodyBytesMax)", bodyBytes, proto.RequestBodyBytesMax)
	case frameBytes > c.frameBytesMax:
		return proto.Errorf(proto.StatusTooLarge, "frame of %d bytes exceeds the tenant's bytes_burst of %d", frameBytes, c.frameBytesMax)
	}
	if a := c.s.cfg.Admitter; a != nil {
		if ok, retry := a.Admit(c.tenant, req.Op, frameBytes); !ok {
			return &proto.Response{Status: proto.StatusThrottled, RetryAfter: max(retry, RetryAfterMin)}
		}
	}
	if msg := c.overTenantLimits(req); msg != "" {
		return proto.Errorf(proto.StatusTooLarge, "%s", msg)
	}
	return nil
}

// String names the connection for logs.
func (h *Hosted) String() string { return fmt.Sprintf("hosted %s", h.c.nc.RemoteAddr()) }
