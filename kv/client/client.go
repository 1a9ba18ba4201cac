// Package client is the Go client of synod's binary protocol.
//
// A Client holds one pipelined connection per server it has talked to and
// sends every request to the server it believes leads. NOT_LEADER moves it
// to the named leader (or the next endpoint when none is named);
// connection failures and UNAVAILABLE move on with exponential back-off;
// THROTTLED waits the server's retry-after. Every call is bounded by its ctx
// (or Options.RequestTimeout when ctx has no deadline) and by
// Options.RetriesMax retries.
//
// Whatever the number of calls waiting, a Client opens at most one
// connection per server at a time: calls that need one wait for the single
// dial in progress, and failed dials back off per server (endpoint.go,
// DialsAllowed).
//
// Writes are exactly-once: the client has a random id and numbers its
// writes; a retried write reuses its (client id, seq), so a write that
// committed before a leader change is not applied twice, and the retry is
// answered with the original result. Any number of goroutines may write
// through one client: a write waits for its sequence while the lowest
// unanswered write is writesInflightMax (256) sequences behind (window.go), so
// the server's exactly-once window always holds every write the client may
// still retry, and the client never causes SEQUENCE_STALE on itself.
//
// With Options.TLS set every connection runs TLS (optionally with a client
// certificate, for servers that require mutual TLS); the protocol and the
// token handshake are the same inside.
package client

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	"synod/kv/proto"
	"synod/tenants"
)

// Defaults and limits.
const (
	RetriesMaxDefault     = 10 // retries after the first attempt
	RetriesCap            = 100
	BackoffBaseDefault    = 2 * time.Millisecond
	BackoffMaxDefault     = 500 * time.Millisecond
	DialTimeoutDefault    = 2 * time.Second
	RequestTimeoutDefault = 10 * time.Second
	// triedRememberedMax bounds the addresses one call remembers having
	// tried (to back off when NOT_LEADER sends it back to one of them).
	triedRememberedMax = 8
	// writesInflightMax bounds the span of this client's unanswered write
	// sequences (lowest unanswered to newest, inclusive), so that the
	// server's exactly-once window (sm.ResultsPerClientMax, the same
	// figure) always still holds the result of any write the client may
	// retry (window.go).
	writesInflightMax = proto.InflightPerConnMax
)

// Options configures a Client. Zero values pick the defaults.
type Options struct {
	RetriesMax     int           // retries per call after the first attempt; capped at RetriesCap
	BackoffBase    time.Duration // first back-off; doubles per retry (full jitter)
	BackoffMax     time.Duration
	DialTimeout    time.Duration
	RequestTimeout time.Duration // per call, when ctx has no deadline
	// Dial opens a transport connection; nil uses net.Dialer (TCP). With
	// TLS set, the TLS session runs over the connection Dial returns.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// TLS, when not nil, makes every connection TLS with this config (the
	// protocol runs unchanged inside; HELLO's token still authenticates
	// the tenant). An empty ServerName is set per connection to the host
	// of the address dialled (endpoint or redirect), so each server is
	// verified against its own name; an IP address is verified against
	// the certificate's IP SANs and not sent as SNI. Certificates holds
	// the client certificate for servers that require one (mutual TLS).
	// The config is cloned, never modified.
	TLS *tls.Config
	// Sleep waits d or until ctx ends; nil uses a timer. Tests inject it.
	Sleep func(ctx context.Context, d time.Duration) error
}

func (o Options) withDefaults() Options {
	if o.RetriesMax <= 0 {
		o.RetriesMax = RetriesMaxDefault
	}
	o.RetriesMax = min(o.RetriesMax, RetriesCap)
	if o.BackoffBase <= 0 {
		o.BackoffBase = BackoffBaseDefault
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = BackoffMaxDefault
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DialTimeoutDefault
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = RequestTimeoutDefault
	}
	if o.Dial == nil {
		d := &net.Dialer{}
		o.Dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	if o.Sleep == nil {
		o.Sleep = sleepCtx
	}
	return o
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Client is safe for concurrent use; concurrent calls are pipelined on
// one connection.
type Client struct {
	token     string
	opts      Options
	endpoints []string
	id        uint64

	// life ends at Close; it bounds every dial (endpoint.go).
	life     context.Context
	stopLife context.CancelFunc

	mu     sync.Mutex
	target string // where requests go: the believed leader
	next   int    // next endpoint to try when the target fails
	// eps holds each address's connection, dial in progress and back-off
	// (endpoint.go). Invariant: at most endpointsMax entries with no dial
	// in progress.
	eps      map[string]*endpoint
	useCount uint64
	closed   bool
	tenant   tenants.ID // from the first connection's HELLO

	// win hands out write sequences and keeps their span within the
	// server's exactly-once window (window.go).
	win writeWindow
}

// New returns a client of endpoints without connecting to any: its first
// call dials (the first endpoint first). Tenant is 0 until a connection
// has been made. It is for a caller that must not wait for a connection
// while holding its own locks (kv/resp's proxy); Dial connects first.
func New(endpoints []string, token string, opts Options) (*Client, error) {
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("%w: no endpoints", ErrConnection)
	}
	var idb [8]byte
	for binary.BigEndian.Uint64(idb[:]) == 0 {
		if _, err := crand.Read(idb[:]); err != nil {
			return nil, fmt.Errorf("client: drawing a client id: %w", err)
		}
	}
	c := &Client{token: token, opts: opts.withDefaults(), endpoints: append([]string(nil), endpoints...),
		id: binary.BigEndian.Uint64(idb[:]), eps: map[string]*endpoint{}}
	c.life, c.stopLife = context.WithCancel(context.Background())
	c.target, c.next = c.endpoints[0], 1%len(c.endpoints)
	c.win.init()
	return c, nil
}

// Dial connects to the first endpoint that accepts the token and returns a
// client. A rejected token fails at once with ErrUnauthorized.
func Dial(ctx context.Context, endpoints []string, token string, opts Options) (*Client, error) {
	c, err := New(endpoints, token, opts)
	if err != nil {
		return nil, err
	}
	var errs []error
	for i, ep := range c.endpoints {
		_, err := c.connTo(ctx, ep)
		if err == nil {
			c.mu.Lock()
			c.target, c.next = ep, (i+1)%len(c.endpoints)
			c.mu.Unlock()
			return c, nil
		}
		if errors.Is(err, ErrUnauthorized) || ctx.Err() != nil {
			c.Close()
			return nil, err
		}
		errs = append(errs, err)
	}
	c.Close()
	return nil, errors.Join(errs...)
}

// ID returns the client id used for exactly-once writes.
func (c *Client) ID() uint64 { return c.id }

// Tenant returns the tenant the token authenticated (0 before the first
// connection of a client made by New).
func (c *Client) Tenant() tenants.ID {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tenant
}

// Close closes every connection and stops the dials in progress. Calls in
// progress fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.stopLife()
	for _, ep := range c.eps {
		if ep.cn != nil {
			ep.cn.close()
		}
	}
	clear(c.eps)
	return nil
}

// currentTarget returns where the next attempt goes.
func (c *Client) currentTarget() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.target
}

// redirect moves the target to leader, or, when leader is empty, from
// failed to the next endpoint (unless another caller already moved it).
func (c *Client) redirect(failed, leader string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if leader != "" {
		c.target = leader
		return
	}
	if c.target == failed {
		c.target = c.endpoints[c.next]
		c.next = (c.next + 1) % len(c.endpoints)
	}
}

// backoff returns the wait before retry number attempt (0-based), with
// full jitter.
func (c *Client) backoff(attempt int) time.Duration {
	d := c.opts.BackoffBase << min(attempt, 20)
	if d <= 0 || d > c.opts.BackoffMax {
		d = c.opts.BackoffMax
	}
	return time.Duration(rand.Int64N(int64(d)) + 1)
}

// do runs req with redirects and retries and returns the final response
// (OK or an error status that retrying cannot change) or an error. A
// write's first unacked comes from the client's window.
func (c *Client) do(ctx context.Context, req *proto.Request) (*proto.Response, error) {
	return c.retry(ctx, req, true, nil)
}

// retry is the loop of every call (do, Forward): it sends req to the
// current target over the target's one connection (connTo), follows
// NOT_LEADER, and retries connection failures, UNAVAILABLE and THROTTLED,
// within ctx (RequestTimeout when it has no deadline) and RetriesMax.
// With ownWindow, each attempt of a write carries the client's current
// first unacked; without, req goes as it is. room (when set) is asked
// before each answer's body is read (Room); its refusal is the call's
// response, not retried: the caller has no room for the answer, and
// asking again would have the node read and send it again.
//
// A redirect to a named leader is retried at once, unless this call
// already sent an attempt there: then nodes are sending it round in a
// circle (stale views during an election) and it backs off like after any
// other failure, so no call spins between them.
func (c *Client) retry(ctx context.Context, req *proto.Request, ownWindow bool, room Room) (*proto.Response, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.RequestTimeout)
		defer cancel()
	}
	var lastErr error
	var tried []string // where this call's attempts went (up to triedRememberedMax)
	for attempt := 0; ; attempt++ {
		target := c.currentTarget()
		if len(tried) < triedRememberedMax && !slices.Contains(tried, target) {
			tried = append(tried, target)
		}
		wait := time.Duration(0)
		cn, err := c.connTo(ctx, target)
		var resp *proto.Response
		refused := false
		if err == nil {
			if ownWindow && req.Op.IsWrite() {
				req.FirstUnacked = c.firstUnacked(req.Seq)
			}
			resp, refused, err = cn.roundTripWithin(ctx, req, room)
		}
		switch {
		case refused:
			return resp, nil
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
			switch {
			case resp.Leader == "" || resp.Leader == target:
				c.redirect(target, "")
				wait = c.backoff(attempt)
			case slices.Contains(tried, resp.Leader):
				c.redirect(target, resp.Leader)
				wait = c.backoff(attempt)
			default:
				c.redirect(target, resp.Leader)
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

// beginWrite assigns the next sequence to a write once the window has
// room for it (window.go) and counts it unacked.
func (c *Client) beginWrite(ctx context.Context, req *proto.Request) error {
	seq, err := c.win.begin(ctx)
	if err != nil {
		return err
	}
	req.ClientID, req.Seq = c.id, seq
	return nil
}

// endWrite forgets a write once it has an answer, or once the caller gave
// up on it: its outcome is then unknown, it is not retried, and first
// unacked moves past it (a late copy reaching the server after that is
// answered SEQUENCE_STALE, and nobody waits for that answer).
func (c *Client) endWrite(seq uint64) { c.win.end(seq) }

// firstUnacked returns the lowest unanswered sequence (at most seq).
func (c *Client) firstUnacked(seq uint64) uint64 { return c.win.first(seq) }

func (c *Client) write(ctx context.Context, req *proto.Request) (*proto.Response, error) {
	if err := c.beginWrite(ctx, req); err != nil {
		return nil, err
	}
	defer c.endWrite(req.Seq)
	return c.do(ctx, req)
}
