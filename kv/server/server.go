// Package server is the TCP front end of synod's binary protocol
// (kv/proto): it authenticates each connection's tenant, reads pipelined
// frames, admits them (shaping hook) from the fixed header before decoding
// the body, hands requests to a Backend and writes responses back with
// coalesced flushes (one writer goroutine drains a channel of responses and
// flushes once per burst, the idea of valyala/fastrpc).
//
// A connection's life: HELLO (token) -> HELLO response with the tenant id,
// or UNAUTHORIZED and close. Then any number of requests, at most
// proto.InflightPerConnMax outstanding; each header must carry the
// authenticated tenant (else UNAUTHORIZED and close). A frame whose header
// cannot be decoded (unknown opcode, flags, oversized length) gets
// BAD_REQUEST or TOO_LARGE and the connection is closed, because the
// stream can no longer be trusted; a body that does not decode gets
// BAD_REQUEST and the connection goes on. Other connections are never
// affected.
//
// Everything a client can make the server hold is bounded (limits.go):
//
//   - connections: authenticated ones node-wide (ConnsMax) and per tenant
//     (ConnsPerTenantMax, below ConnsMax so one tenant cannot take every
//     slot); connections that have not completed HELLO in a pool of their
//     own (ConnsUnauthenticatedMax), so a flood of them cannot refuse a
//     real client; and connections per source address (ConnsPerSourceMax).
//     A full pre-HELLO pool makes room by closing its oldest member: an
//     honest client sends HELLO at once, so it is never the oldest for
//     long.
//   - time: HELLO within HandshakeTimeout, each frame's bytes within
//     FrameTimeout of its first byte, a request at least every IdleTimeout
//     while nothing is in flight, and each flush within WriteTimeout.
//   - response bytes: every request reserves room for its answer before it
//     is read (a SCAN its largest possible reply) in its connection's,
//     tenant's and the node's budgets, and the bytes stay charged until
//     the writer has handed them to the kernel. A connection whose client
//     does not read its answers fills its own budget and is then no longer
//     read (TCP back-pressure), until WriteTimeout closes it.
//   - log lines about bad connections and requests: at most
//     logLinesPerSecMax per second each, with the count of those
//     suppressed.
package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"synod/kv/proto"
	"synod/tenants"
)

// Backend executes requests. The replica runtime implements it on top of
// consensus; kv/local implements it on a single state machine.
type Backend interface {
	// Do executes one request for an authenticated tenant and returns its
	// response (the server fills in Op, ID and Tenant). req.Op is one of
	// GET, PUT, DELETE, CAS, SCAN, BATCH, STATUS, or a membership
	// operation whose admin token the server checked (admin.go);
	// req.Tenant equals tenant.
	// Writes are answered at commit; linearizable reads per the read path
	// (FlagStaleOK allows a local read). It must honour ctx: when ctx ends
	// it returns UNAVAILABLE (a write may still commit later; the client's
	// retry with the same (client id, seq) is answered from the
	// exactly-once table). Do is called concurrently.
	Do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response
}

// Admitter decides, from the fixed header alone, whether a request may
// proceed. ok=false answers THROTTLED with retryAfter (raised to
// RetryAfterMin) and skips the body. It is called on the connection's
// reader goroutine and must not block.
type Admitter interface {
	Admit(tenant tenants.ID, op proto.Opcode, frameBytes int) (ok bool, retryAfter time.Duration)
}

// Defaults and limits of the server. Every default is what a zero Config
// field means; kvnode's [limits] table sets them (cmd/kvnode/config_limits.go).
const (
	RequestTimeoutDefault = 5 * time.Second
	// HandshakeTimeoutDefault bounds accept-to-HELLO: a client sends HELLO
	// as its first bytes, so anything slower is a stalled or hostile peer
	// holding a pre-HELLO slot.
	HandshakeTimeoutDefault = 5 * time.Second
	// IdleTimeoutDefault closes an authenticated connection that has
	// nothing in flight and sends nothing for this long. Long enough that
	// a client's pooled connection survives ordinary pauses; short enough
	// that abandoned connections do not pile up (they are capped anyway).
	IdleTimeoutDefault = 5 * time.Minute
	// FrameTimeoutDefault bounds the arrival of one frame, from its first
	// byte to its last: a largest request frame (1 MiB) at 100 KB/s.
	FrameTimeoutDefault = 10 * time.Second
	// WriteTimeoutDefault bounds one flush to a client; a client that
	// reads nothing for this long is disconnected.
	WriteTimeoutDefault = 10 * time.Second
	// ConnsMaxDefault bounds authenticated connections per node.
	ConnsMaxDefault = 1024
	// ConnsPerTenantDivisor: a zero ConnsPerTenantMax is ConnsMax divided
	// by this (256 by default), so at least four tenants are needed to
	// fill a node.
	ConnsPerTenantDivisor = 4
	// ConnsPerSourceMaxDefault bounds the connections, authenticated or
	// not, from one source address (IPv6: one /64). Twice a tenant's cap,
	// so that a tenant whose clients share one address can use its whole
	// cap and still leave room for others behind the same address.
	ConnsPerSourceMaxDefault = 512
	// ConnsUnauthenticatedMaxDefault bounds connections that have not
	// completed HELLO. Honest ones hold a slot for one round trip.
	ConnsUnauthenticatedMaxDefault = 256
	// ResponseBytesPerConnMaxDefault bounds the response bytes reserved
	// or queued on one connection: room for two of the largest SCAN
	// replies, or 2048 small answers (all InflightPerConnMax requests).
	ResponseBytesPerConnMaxDefault = 8 << 20
	// ResponseBytesPerTenantMaxDefault bounds them over a tenant's
	// connections: a quarter of the node's, so no tenant fills the node.
	// It also bounds the burst of work one tenant can start at once: at
	// 64 MiB, four connections of reader-less SCANs ran 20 scans of
	// 2.7 MB together, and a freshly started leader on two cores lost
	// its leadership in a third of the runs; at 24 MiB (seven) it did not.
	ResponseBytesPerTenantMaxDefault = 24 << 20
	// ResponseBytesPerNodeMaxDefault bounds them over the whole node.
	ResponseBytesPerNodeMaxDefault = 96 << 20
	// RequestBytesPerConnMaxDefault bounds the request body bytes one
	// connection holds in flight (read and not yet answered): eight of the
	// largest requests. Without it a connection pipelining 256 writes of a
	// megabyte held 256 MiB of bodies, and with their copies on the way to
	// consensus a leader grew from 182 MiB to 1.5-1.8 GiB, past its 1 GiB
	// memory budget, and lost its leadership (an outside tester).
	RequestBytesPerConnMaxDefault = 8 << 20
	// RequestBytesPerTenantMaxDefault bounds them over a tenant's
	// connections.
	RequestBytesPerTenantMaxDefault = 24 << 20
	// RequestBytesPerNodeMaxDefault bounds them over the whole node: each
	// body is copied about four times on its way into consensus, so this
	// is about 200 MiB of heap at most.
	RequestBytesPerNodeMaxDefault = 48 << 20
	// RetryAfterMin is the least retry-after sent with THROTTLED: a hint of
	// a few microseconds (a bucket one frame short) only makes clients
	// spin; at 1 ms a throttled request is retried at most 1000 times a
	// second.
	RetryAfterMin = time.Millisecond

	readBufferBytes  = 64 << 10
	writeBufferBytes = 64 << 10
	// writeQueueFrames bounds the responses waiting for the writer: one per
	// in-flight request plus the few the reader answers itself.
	writeQueueFrames = proto.InflightPerConnMax + 8
)

// Bounds on the configurable durations (Validate).
const (
	TimeoutMin = 100 * time.Millisecond
	TimeoutMax = 24 * time.Hour
)

// Config configures a Server. Zero values pick the defaults.
type Config struct {
	// RequestTimeout bounds one Backend.Do call (its ctx deadline).
	RequestTimeout time.Duration
	// HandshakeTimeout bounds the time from accept to a valid HELLO.
	HandshakeTimeout time.Duration
	// IdleTimeout closes an authenticated connection with no request in
	// flight, no answer unwritten and no byte received for this long.
	IdleTimeout time.Duration
	// FrameTimeout bounds the time from a frame's first byte to its last;
	// a frame that trickles in slower closes the connection.
	FrameTimeout time.Duration
	// WriteTimeout bounds one flush to a slow client; past it the
	// connection is closed.
	WriteTimeout time.Duration
	// ConnsMax bounds authenticated connections; a HELLO past it gets
	// UNAVAILABLE and the connection is closed.
	ConnsMax int
	// ConnsPerTenantMax bounds one tenant's authenticated connections
	// (0: ConnsMax / ConnsPerTenantDivisor, at least 1); a HELLO past it
	// gets THROTTLED and the connection is closed.
	ConnsPerTenantMax int
	// ConnsPerSourceMax bounds connections from one source address
	// (IPv6: one /64). A connection past it closes the source's oldest
	// pre-HELLO connection, or is closed at accept when there is none.
	ConnsPerSourceMax int
	// ConnsUnauthenticatedMax bounds connections that have not completed
	// HELLO; a new one past it closes the oldest of them.
	ConnsUnauthenticatedMax int
	// ResponseBytesPerConnMax, ResponseBytesPerTenantMax and
	// ResponseBytesPerNodeMax bound the response bytes reserved for
	// requests in flight plus those encoded and not yet written, per
	// connection, per tenant and per node.
	ResponseBytesPerConnMax   int64
	ResponseBytesPerTenantMax int64
	ResponseBytesPerNodeMax   int64
	// RequestBytesPerConnMax, RequestBytesPerTenantMax and
	// RequestBytesPerNodeMax bound the request body bytes read and not
	// yet answered, per connection (past it the connection is not read:
	// TCP back-pressure), per tenant and per node (past those a request is
	// answered THROTTLED, its body skipped): request_budget.go.
	RequestBytesPerConnMax   int64
	RequestBytesPerTenantMax int64
	RequestBytesPerNodeMax   int64
	// Admitter is the admission hook; nil admits everything.
	Admitter Admitter
	// AdminToken authorizes membership operations (admin.go); empty
	// refuses them all.
	AdminToken string
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	setDur := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	setDur(&c.RequestTimeout, RequestTimeoutDefault)
	setDur(&c.HandshakeTimeout, HandshakeTimeoutDefault)
	setDur(&c.IdleTimeout, IdleTimeoutDefault)
	setDur(&c.FrameTimeout, FrameTimeoutDefault)
	setDur(&c.WriteTimeout, WriteTimeoutDefault)
	if c.ConnsMax <= 0 {
		c.ConnsMax = ConnsMaxDefault
	}
	if c.ConnsPerTenantMax <= 0 {
		c.ConnsPerTenantMax = max(1, c.ConnsMax/ConnsPerTenantDivisor)
	}
	if c.ConnsPerSourceMax <= 0 {
		c.ConnsPerSourceMax = ConnsPerSourceMaxDefault
	}
	if c.ConnsUnauthenticatedMax <= 0 {
		c.ConnsUnauthenticatedMax = ConnsUnauthenticatedMaxDefault
	}
	if c.ResponseBytesPerConnMax <= 0 {
		c.ResponseBytesPerConnMax = ResponseBytesPerConnMaxDefault
	}
	if c.ResponseBytesPerTenantMax <= 0 {
		c.ResponseBytesPerTenantMax = max(ResponseBytesPerTenantMaxDefault, c.ResponseBytesPerConnMax+int64(c.ConnsPerTenantMax)*responseBytesReserved)
	}
	if c.ResponseBytesPerNodeMax <= 0 {
		c.ResponseBytesPerNodeMax = max(ResponseBytesPerNodeMaxDefault, c.ResponseBytesPerTenantMax+int64(c.ConnsMax)*responseBytesReserved)
	}
	if c.RequestBytesPerConnMax <= 0 {
		c.RequestBytesPerConnMax = RequestBytesPerConnMaxDefault
	}
	if c.RequestBytesPerTenantMax <= 0 {
		c.RequestBytesPerTenantMax = max(RequestBytesPerTenantMaxDefault, c.RequestBytesPerConnMax)
	}
	if c.RequestBytesPerNodeMax <= 0 {
		c.RequestBytesPerNodeMax = max(RequestBytesPerNodeMaxDefault, c.RequestBytesPerTenantMax)
	}
	return c
}

// Validate reports a configuration the server cannot run safely, after
// filling in the defaults. Errors name the fields as kvnode's [limits]
// keys do. New panics on such a configuration; kvnode reports it when it
// reads its config.
func (c Config) Validate() error {
	c = c.WithDefaults()
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"request_timeout", c.RequestTimeout}, {"handshake_timeout", c.HandshakeTimeout}, {"idle_timeout", c.IdleTimeout},
		{"frame_timeout", c.FrameTimeout}, {"write_timeout", c.WriteTimeout}} {
		if d.d < TimeoutMin || d.d > TimeoutMax {
			return fmt.Errorf("%s: %v is outside [%v, %v]", d.name, d.d, TimeoutMin, TimeoutMax)
		}
	}
	switch {
	case c.ConnsPerTenantMax > c.ConnsMax:
		return fmt.Errorf("conns_per_tenant_max: %d exceeds conns_max (%d)", c.ConnsPerTenantMax, c.ConnsMax)
	case c.ResponseBytesPerConnMax < ResponseBytesPerConnMin:
		return fmt.Errorf("response_bytes_per_conn_max: %d is below %d, the largest reply a request can reserve "+
			"(a SCAN of ScanReplyBytesMax and one more pair) plus one reservation", c.ResponseBytesPerConnMax, ResponseBytesPerConnMin)
	case c.ResponseBytesPerTenantMax < c.ResponseBytesPerConnMax+int64(c.ConnsPerTenantMax)*responseBytesReserved:
		return fmt.Errorf("response_bytes_per_tenant_max: %d is below one connection's budget (%d) plus the %d bytes each of "+
			"the tenant's %d connections holds while it waits for a request", c.ResponseBytesPerTenantMax, c.ResponseBytesPerConnMax,
			responseBytesReserved, c.ConnsPerTenantMax)
	case c.ResponseBytesPerNodeMax < c.ResponseBytesPerTenantMax+int64(c.ConnsMax)*responseBytesReserved:
		return fmt.Errorf("response_bytes_per_node_max: %d is below one tenant's budget (%d) plus the %d bytes each of "+
			"the node's %d connections holds while it waits for a request", c.ResponseBytesPerNodeMax, c.ResponseBytesPerTenantMax,
			responseBytesReserved, c.ConnsMax)
	case c.RequestBytesPerConnMax < RequestBytesPerConnMin:
		return fmt.Errorf("request_bytes_per_conn_max: %d is below %d, the largest request body (RequestBodyBytesMax)",
			c.RequestBytesPerConnMax, RequestBytesPerConnMin)
	case c.RequestBytesPerTenantMax < c.RequestBytesPerConnMax:
		return fmt.Errorf("request_bytes_per_tenant_max: %d is below one connection's budget (request_bytes_per_conn_max, %d)",
			c.RequestBytesPerTenantMax, c.RequestBytesPerConnMax)
	case c.RequestBytesPerNodeMax < c.RequestBytesPerTenantMax:
		return fmt.Errorf("request_bytes_per_node_max: %d is below one tenant's budget (request_bytes_per_tenant_max, %d)",
			c.RequestBytesPerNodeMax, c.RequestBytesPerTenantMax)
	}
	return nil
}

// ErrConfig wraps the error New panics with.
var ErrConfig = errors.New("server: invalid config")

// Stats are the server's counters, for tests and metrics.
type Stats struct {
	ConnsAuthenticated   int // connections past HELLO
	ConnsUnauthenticated int // connections before HELLO
	// ConnsRefused counts connections closed at accept or answered at
	// HELLO because a connection cap was reached; ConnsEvicted the
	// pre-HELLO connections closed to make room for newer ones.
	ConnsRefused uint64
	ConnsEvicted uint64
	// AcceptsFailed counts accept errors the listener loop waited out
	// (out of file descriptors, most likely: Serve).
	AcceptsFailed uint64
	// ResponseBytes is what the node's response budget holds now (bytes
	// reserved for requests in flight plus answers not yet written);
	// ResponseBytesPeak the most it ever held.
	ResponseBytes     int64
	ResponseBytesPeak int64
	// RequestBytes is what the node's request budget holds now (bodies
	// of requests read and not yet answered); RequestBytesPeak the most.
	RequestBytes     int64
	RequestBytesPeak int64
	// ResponsesThrottled counts requests answered THROTTLED because a
	// response or request budget (the tenant's or the node's) had no
	// room.
	ResponsesThrottled uint64
	// FramesPaced counts frames a connection's reader read late because
	// the connection's last answers were all THROTTLED (refused_pace.go).
	FramesPaced uint64
	// ConnsPacedAtHello counts connections paced from their HELLO on:
	// their tenant had a connection in a paced run within
	// tenantPaceCarryOver (refused_pace.go).
	ConnsPacedAtHello uint64
	// LogLinesSuppressed counts log lines the rate limit dropped.
	LogLinesSuppressed uint64
}
