package main

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
)

// cappedListener holds at most max accepted connections at once, so a
// flood of connections costs the process at most max descriptors. At the
// cap a new connection takes the place of one that has not yet been
// proven (carried a request with the admin token, adminAuth): the oldest
// of the source address that holds the most unproven places. A
// stranger's connections, however many and however slow, cannot keep out
// an operator's: it is proven by its first request, and until then a
// stranger at another address loses places first. (From the same
// address, a stranger opening connections faster than the operator's
// first request is served can still evict it; the operator's retry is
// answered.) When every connection held is proven, the new one is closed
// instead. An outside tester who held the 64 places of a
// first version (which let further connections wait in the kernel's
// queue) with unauthenticated requests locked operators out of /metrics
// and /healthz: 0 of 35 probes answered.
type cappedListener struct {
	net.Listener
	max int

	mu    sync.Mutex
	conns []*cappedConn // held, oldest first

	evicted, refused atomic.Uint64
}

func newCappedListener(ln net.Listener, max int) *cappedListener {
	return &cappedListener{Listener: ln, max: max}
}

// Accept accepts the next connection, making room for it.
func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cc := &cappedConn{Conn: c, l: l, source: addrHost(c.RemoteAddr())}
		l.mu.Lock()
		var victim *cappedConn
		if len(l.conns) >= l.max {
			if victim = l.victimLocked(); victim == nil {
				l.mu.Unlock()
				l.refused.Add(1)
				c.Close()
				continue
			}
			l.removeLocked(victim)
			l.evicted.Add(1)
		}
		l.conns = append(l.conns, cc)
		l.mu.Unlock()
		if victim != nil {
			victim.Conn.Close() // its server goroutine sees the error and closes it again: once is counted
		}
		return cc, nil
	}
}

// victimLocked picks the connection to evict for a new one (l.mu held):
// the oldest unproven connection of the source holding the most unproven
// ones; nil when every connection is proven.
func (l *cappedListener) victimLocked() *cappedConn {
	count := map[string]int{}
	top := ""
	for _, o := range l.conns {
		if o.proven.Load() {
			continue
		}
		count[o.source]++
		if count[o.source] > count[top] || top == "" {
			top = o.source
		}
	}
	if top == "" {
		return nil
	}
	anySource := testingEvictIgnoresSource.Load()
	for _, o := range l.conns {
		if !o.proven.Load() && (o.source == top || anySource) {
			return o
		}
	}
	return nil
}

// testingEvictIgnoresSource plants the first version's choice: the oldest
// unproven connection, whatever its source.
var testingEvictIgnoresSource atomic.Bool

// removeLocked drops c from the held connections (l.mu held); false when
// it was not there (already evicted).
func (l *cappedListener) removeLocked(c *cappedConn) bool {
	for i, o := range l.conns {
		if o == c {
			l.conns = append(l.conns[:i], l.conns[i+1:]...)
			return true
		}
	}
	return false
}

// open is the number of connections held.
func (l *cappedListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// cappedConn is a held connection.
type cappedConn struct {
	net.Conn
	l      *cappedListener
	source string // the remote address without its port
	proven atomic.Bool
}

// addrHost is a's host without its port.
func addrHost(a net.Addr) string {
	if a == nil {
		return ""
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}

// Close closes the connection and gives its place back.
func (c *cappedConn) Close() error {
	c.l.mu.Lock()
	c.l.removeLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// adminConnKey is the request context key of the request's cappedConn.
type adminConnKey struct{}

// withAdminConn is the admin server's ConnContext: it lets adminAuth find
// the connection a request came on, to prove it.
func withAdminConn(ctx context.Context, c net.Conn) context.Context {
	if cc, ok := c.(*cappedConn); ok {
		return context.WithValue(ctx, adminConnKey{}, cc)
	}
	return ctx
}

// proveAdminConn marks the connection of a request that carried the admin
// token (or came to an endpoint without one) as proven: it keeps its
// place at the cap.
func proveAdminConn(ctx context.Context) {
	if cc, ok := ctx.Value(adminConnKey{}).(*cappedConn); ok {
		cc.proven.Store(true)
	}
}
