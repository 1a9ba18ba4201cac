package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Connection management: one connection per endpoint per client.
//
// A Client keeps, for every server address it uses (its endpoints and the
// leaders NOT_LEADER answers name), one endpoint: at most one connection
// and at most one dial in progress. Any number of calls that need a
// connection to an address while it has none wait for the single dial in
// progress (each bounded by its own ctx) and share its outcome; none of
// them dials on its own. (The client used to let every waiting call dial
// its own connection and close the losers of the race: under leader
// changes 16 clients with a few hundred waiting calls each opened 1,328
// connections to one node, past its 1024-connection limit.)
//
// Failures back off per endpoint. A dial that fails, or a connection that
// dies before it answered any request, counts as a failure; after the n-th
// failure in a row no dial to that address starts before
// dialBackoff(n) has passed since the failed dial started: a wait drawn
// uniformly from [d/2, d], d = DialBackoffBase << (n-1) capped at
// DialBackoffMax (the jitter keeps many clients from reconnecting in
// step). A call that finds its address backing off fails at once with
// ErrConnection (naming the last failure), so its retry loop moves on to
// another endpoint instead of waiting. A connection that answered at least
// one request resets the count: when it dies (the node was killed, a
// leader change closed it), the next dial may start at once.
//
// Consequence (a contract, TestDialsBoundedWhileUnreachable): within any
// period of length d in which no connection to an address answers a
// request, at most DialsAllowed(d) dials to it start, however many calls
// wait and however often NOT_LEADER names it.
const (
	// DialBackoffBase is the back-off after the first failure in a row.
	DialBackoffBase = 10 * time.Millisecond
	// DialBackoffMax caps the back-off (before the jitter halves it at
	// most): a node that comes back is redialled within this long.
	DialBackoffMax = 500 * time.Millisecond
	// endpointsMax bounds the addresses a client keeps state for (its
	// endpoints and the leaders it was redirected to). Past it, the state
	// of an address with no dial in progress is dropped (its connection
	// closed), so that servers naming ever new leaders cannot grow it.
	endpointsMax = 64
)

// DialsAllowed returns the most dials to one address that a Client starts
// within any period of length d in which no connection to that address
// answers a request: the first may start at once (a connection that had
// answered just died), each later one waits at least the lower end of the
// jittered back-off of the failures before it.
func DialsAllowed(d time.Duration) int {
	n := 1
	var t time.Duration
	for k := 1; ; k++ {
		t += dialBackoffCap(k) / 2
		if t > d {
			return n
		}
		n++
	}
}

// dialBackoffCap is the upper end of the back-off after failure n >= 1.
func dialBackoffCap(n int) time.Duration {
	d := DialBackoffBase << min(n-1, 20)
	if d <= 0 || d > DialBackoffMax {
		d = DialBackoffMax
	}
	return d
}

// dialBackoff draws the back-off after failure n >= 1 from [cap/2, cap].
func dialBackoff(n int) time.Duration {
	d := dialBackoffCap(n)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// endpoint is the connection state of one address (under Client.mu).
type endpoint struct {
	addr string
	// cn is the current connection (nil: none). It may have died since it
	// was last looked at: connTo forgets a dead one and counts the
	// failure then.
	cn *conn
	// cnStart is when the dial that made cn started.
	cnStart time.Time
	// dialing is the dial in progress; nil when none. Invariant: at most
	// one per endpoint, and cn is nil while it runs.
	dialing *dialCall
	// failures counts failed dials, and connections that died before
	// answering anything, since the last connection that answered.
	failures int
	// retryAt: no dial starts before it (the back-off of the last
	// failure); lastErr says why that failure happened.
	retryAt time.Time
	lastErr error
	// used orders endpoints for eviction (the client's use counter).
	used uint64
}

// dialCall is one dial; done is closed once cn or err is set.
type dialCall struct {
	done  chan struct{}
	start time.Time
	cn    *conn
	err   error
}

// ErrBackingOff is wrapped, with ErrConnection and the failure that caused
// it, in the error of a call that found its address backing off.
var ErrBackingOff = errors.New("client: endpoint backing off after failures")

// connTo returns the live connection to addr, waiting (bounded by ctx) for
// the dial in progress, or starting the one dial when there is none and
// addr is not backing off.
func (c *Client) connTo(ctx context.Context, addr string) (*conn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	ep, err := c.endpointLocked(addr)
	if err != nil {
		c.mu.Unlock()
		return nil, err
	}
	if ep.cn != nil {
		if ep.cn.dead() == nil {
			cn := ep.cn
			c.mu.Unlock()
			return cn, nil
		}
		ep.forgetDeadLocked()
	}
	call := ep.dialing
	if call == nil {
		now := time.Now()
		if now.Before(ep.retryAt) {
			err := fmt.Errorf("%w: %w: %s for %v more (last failure: %v)", ErrConnection, ErrBackingOff, addr,
				ep.retryAt.Sub(now).Round(time.Millisecond), ep.lastErr)
			c.mu.Unlock()
			return nil, err
		}
		call = &dialCall{done: make(chan struct{}), start: now}
		ep.dialing = call
		go c.runDial(ep, call)
	}
	c.mu.Unlock()
	select {
	case <-call.done:
		return call.cn, call.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// runDial performs ep's dial call. It runs on its own goroutine, bounded
// by DialTimeout and by Close, not by the ctx of the call that started it:
// the calls waiting for it may give up one by one without cutting it short
// for the others, and a connection made after they all left serves the
// next call.
func (c *Client) runDial(ep *endpoint, call *dialCall) {
	ctx, cancel := context.WithTimeout(c.life, c.opts.DialTimeout)
	cn, err := dialConn(ctx, c.opts.Dial, c.opts.TLS, ep.addr, c.token)
	cancel()
	c.mu.Lock()
	if err == nil && (c.closed || c.eps[ep.addr] != ep) {
		// Closed, or evicted (endpointsMax) while dialling.
		cn.close()
		cn, err = nil, ErrClosed
		if !c.closed {
			err = fmt.Errorf("%w: %s: dropped from the client's endpoint table while dialling", ErrConnection, ep.addr)
		}
	}
	if err != nil {
		ep.failures++
		ep.retryAt = call.start.Add(dialBackoff(ep.failures))
		ep.lastErr = err
	} else {
		ep.cn, ep.cnStart = cn, call.start
		if c.tenant == 0 {
			c.tenant = cn.tenant
		}
	}
	ep.dialing = nil
	call.cn, call.err = cn, err
	c.mu.Unlock()
	close(call.done)
}

// forgetDeadLocked drops ep's dead connection: one that never answered is
// a failure (backing off from its dial's start); one that answered resets
// the failure count, and the next dial may start at once.
func (ep *endpoint) forgetDeadLocked() {
	cn := ep.cn
	ep.cn = nil
	if cn.answered.Load() {
		ep.failures, ep.retryAt = 0, time.Time{}
		return
	}
	ep.failures++
	ep.retryAt = ep.cnStart.Add(dialBackoff(ep.failures))
	ep.lastErr = cn.dead()
}

// endpointLocked returns addr's endpoint, creating it; at endpointsMax it
// first drops the least recently used endpoint with no dial in progress
// (and fails when every one has a dial in progress).
func (c *Client) endpointLocked(addr string) (*endpoint, error) {
	c.useCount++
	if ep := c.eps[addr]; ep != nil {
		ep.used = c.useCount
		return ep, nil
	}
	if len(c.eps) >= endpointsMax {
		var victim *endpoint
		for _, ep := range c.eps {
			if ep.dialing == nil && (victim == nil || ep.used < victim.used) {
				victim = ep
			}
		}
		if victim == nil {
			return nil, fmt.Errorf("%w: %s: %d addresses are being dialled already (endpointsMax)", ErrConnection, addr, endpointsMax)
		}
		if victim.cn != nil {
			victim.cn.close()
		}
		delete(c.eps, victim.addr)
	}
	ep := &endpoint{addr: addr, used: c.useCount}
	c.eps[addr] = ep
	return ep, nil
}
