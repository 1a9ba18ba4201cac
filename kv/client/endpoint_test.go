package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/proto"
	"synod/kv/server"
	"synod/tenants"
)

// liveConns counts c's live connections.
func (c *Client) liveConns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ep := range c.eps {
		if ep.cn != nil && ep.cn.dead() == nil {
			n++
		}
	}
	return n
}

// countingListener is a real listener that counts the connections it
// accepts and can drop them all (what a node's death does to them).
type countingListener struct {
	net.Listener
	accepts atomic.Int64
	// dropUnanswered makes every accepted connection close itself when
	// its first request after HELLO arrives, before any answer: a server
	// that takes HELLO and then dies, again and again.
	dropUnanswered bool

	mu    sync.Mutex
	conns []net.Conn
}

func (l *countingListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepts.Add(1)
	l.mu.Lock()
	l.conns = append(l.conns, nc)
	l.mu.Unlock()
	if l.dropUnanswered {
		nc = &closeOnSecondRead{Conn: nc}
	}
	return nc, nil
}

// dropAll closes every connection accepted so far.
func (l *countingListener) dropAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, nc := range l.conns {
		nc.Close()
	}
	l.conns = nil
}

// closeOnSecondRead closes the connection when its second read returns:
// the client sends HELLO and waits for the answer, so the first read holds
// HELLO alone and the second the first request.
type closeOnSecondRead struct {
	net.Conn
	reads atomic.Int64
}

func (c *closeOnSecondRead) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.reads.Add(1) >= 2 {
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return n, err
}

// fakeNode is a kv/server on a fixed loopback address that can be killed
// (listener and connections closed) and started again on the same address.
type fakeNode struct {
	t    testing.TB
	addr string
	be   server.Backend
	drop bool

	mu  sync.Mutex
	srv *server.Server
	ln  *countingListener
	// accepts counts accepted connections over every life of the node.
	accepts atomic.Int64
}

func newFakeNode(t testing.TB, be server.Backend) *fakeNode {
	n := &fakeNode{t: t, be: be}
	n.start()
	t.Cleanup(n.kill)
	return n
}

func (n *fakeNode) start() {
	n.t.Helper()
	addr := n.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	var err error
	for i := 0; i < 100; i++ { // the port may linger a moment after a kill
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		n.t.Fatal(err)
	}
	n.addr = ln.Addr().String()
	reg, err := tenants.NewRegistry([]tenants.Spec{{ID: 3, Name: "t", Token: token}})
	if err != nil {
		n.t.Fatal(err)
	}
	cl := &countingListener{Listener: ln, dropUnanswered: n.drop}
	srv := server.New(server.Config{}, reg, n.be, zerolog.Nop())
	go srv.Serve(&acceptTally{cl, &n.accepts})
	n.mu.Lock()
	n.srv, n.ln = srv, cl
	n.mu.Unlock()
}

func (n *fakeNode) kill() {
	n.mu.Lock()
	srv, ln := n.srv, n.ln
	n.srv, n.ln = nil, nil
	n.mu.Unlock()
	if srv != nil {
		srv.Close()
		ln.dropAll()
	}
}

// acceptTally adds each accept of its listener to a total kept across
// the node's lives.
type acceptTally struct {
	*countingListener
	total *atomic.Int64
}

func (a *acceptTally) Accept() (net.Conn, error) {
	nc, err := a.countingListener.Accept()
	if err == nil {
		a.total.Add(1)
	}
	return nc, err
}

// dialCounter wraps the default dialer and counts dial attempts per
// address.
type dialCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *dialCounter) dial(ctx context.Context, addr string) (net.Conn, error) {
	d.mu.Lock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[addr]++
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", addr)
}

func (d *dialCounter) count(addr string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[addr]
}

// hammer runs goroutines calls of f each, in parallel, and waits.
func hammer(goroutines, calls int, f func(g, i int)) {
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < calls; i++ {
				f(g, i)
			}
		}()
	}
	wg.Wait()
}

// TestOneDialForManyWaiters: hundreds of calls needing a connection at
// once share one dial, the first time and again after the server dropped
// the connection; a caller whose ctx ends stops waiting without cutting
// the dial short for the others.
func TestOneDialForManyWaiters(t *testing.T) {
	const waiters = 500
	nd := newFakeNode(t, localBackend(t))
	gate := make(chan struct{})
	var dials atomic.Int64
	c, err := New([]string{nd.addr}, token, Options{Dial: func(ctx context.Context, addr string) (net.Conn, error) {
		dials.Add(1)
		select {
		case <-gate: // held until every waiter is queued behind it
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Tenant() != 0 {
		t.Fatalf("tenant %d before any connection", c.Tenant())
	}
	// One impatient caller gives up while the dial is held.
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := c.Ping(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("impatient ping: %v", err)
	}
	var failed atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Put(context.Background(), []byte(fmt.Sprint(i)), []byte("v")); err != nil {
				failed.Add(1)
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(gate)
	wg.Wait()
	if failed.Load() != 0 || dials.Load() != 1 || nd.accepts.Load() != 1 {
		t.Fatalf("%d failed, %d dials, %d accepts; want 0, 1, 1", failed.Load(), dials.Load(), nd.accepts.Load())
	}
	if c.Tenant() != 3 {
		t.Fatalf("tenant %d after connecting", c.Tenant())
	}
	// The node drops every connection (a leader change closed them): the
	// waiting calls fail over, and the next wave shares one new dial.
	nd.mu.Lock()
	nd.ln.dropAll()
	nd.mu.Unlock()
	hammer(waiters, 2, func(g, i int) {
		if err := c.Put(context.Background(), []byte(fmt.Sprint(g, i)), []byte("v")); err != nil {
			failed.Add(1)
		}
	})
	if failed.Load() != 0 || dials.Load() != 2 || nd.accepts.Load() != 2 {
		t.Fatalf("after the drop: %d failed, %d dials, %d accepts; want 0, 2, 2", failed.Load(), dials.Load(), nd.accepts.Load())
	}
}

// TestDialsBoundedWhileUnreachable checks DialsAllowed's contract: while
// no connection to an address answers, at most DialsAllowed(d) dials to
// it start within d, however many calls hammer it. Three kinds of
// unreachable: nothing listens (refused), a server that takes HELLO and
// drops every connection at its first request (a connection that never
// answers is a failure too), and a leader named by NOT_LEADER that does
// not exist.
func TestDialsBoundedWhileUnreachable(t *testing.T) {
	const (
		goroutines = 200
		period     = time.Second
	)
	refused := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}
	for _, tc := range []struct {
		name string
		// setup returns the client's endpoints and the address whose
		// dials are counted.
		setup func(t *testing.T) (eps []string, counted string)
	}{
		{"refused", func(t *testing.T) ([]string, string) {
			a := refused()
			return []string{a}, a
		}},
		{"dies-before-answering", func(t *testing.T) ([]string, string) {
			nd := &fakeNode{t: t, be: localBackend(t), drop: true}
			nd.start()
			t.Cleanup(nd.kill)
			return []string{nd.addr}, nd.addr
		}},
		{"dead-leader-hint", func(t *testing.T) ([]string, string) {
			dead := refused()
			follower := newFakeNode(t, funcBackend(func(ctx context.Context, _ tenants.ID, req *proto.Request) *proto.Response {
				return &proto.Response{Status: proto.StatusNotLeader, Leader: dead}
			}))
			return []string{follower.addr}, dead
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eps, counted := tc.setup(t)
			dc := &dialCounter{}
			c, err := New(eps, token, Options{Dial: dc.dial, RetriesMax: RetriesCap, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			hammer(goroutines, 1, func(g, i int) {
				ctx, cancel := context.WithDeadline(context.Background(), start.Add(period))
				defer cancel()
				for ctx.Err() == nil {
					c.Get(ctx, []byte("k"))
				}
			})
			// Every dial counted started within elapsed of the first.
			elapsed := time.Since(start)
			n, bound := dc.count(counted), DialsAllowed(elapsed)
			t.Logf("%s: %d dials in %v (DialsAllowed %d)", tc.name, n, elapsed.Round(time.Millisecond), bound)
			if n == 0 || n > bound {
				t.Fatalf("%d dials to %s within %v; DialsAllowed allows %d", n, counted, elapsed, bound)
			}
		})
	}
}

func TestDialsAllowed(t *testing.T) {
	// The lower ends of the back-offs are 5, 10, 20, ... ms, capped at
	// DialBackoffMax/2 = 250 ms.
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{{0, 1}, {4 * time.Millisecond, 1}, {5 * time.Millisecond, 2}, {15 * time.Millisecond, 3},
		{315 * time.Millisecond, 7}, {565 * time.Millisecond, 8}, {10*time.Second + 65*time.Millisecond, 46}} {
		if got := DialsAllowed(tc.d); got != tc.want {
			t.Errorf("DialsAllowed(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
	for n := 1; n < 40; n++ {
		lo, hi := dialBackoffCap(n)/2, dialBackoffCap(n)
		for i := 0; i < 50; i++ {
			if d := dialBackoff(n); d < lo || d > hi {
				t.Fatalf("dialBackoff(%d) = %v outside [%v, %v]", n, d, lo, hi)
			}
		}
	}
}

// TestEndpointTableBounded: servers naming ever new leaders cannot grow a
// client's endpoint table past endpointsMax.
func TestEndpointTableBounded(t *testing.T) {
	var next atomic.Int64
	follower := newFakeNode(t, funcBackend(func(ctx context.Context, _ tenants.ID, req *proto.Request) *proto.Response {
		// A new made-up leader each time (port 1: refused at once).
		return &proto.Response{Status: proto.StatusNotLeader, Leader: fmt.Sprintf("127.0.0.%d:1", 2+next.Add(1)%250)}
	}))
	rs := &recordSleep{}
	c := dial(t, []string{follower.addr}, Options{Sleep: rs.sleep, RetriesMax: RetriesCap})
	for i := 0; i < 5; i++ {
		c.Get(context.Background(), []byte("k"))
	}
	c.mu.Lock()
	n := len(c.eps)
	c.mu.Unlock()
	if next.Load() < 2*endpointsMax || n > endpointsMax {
		t.Fatalf("%d leaders named, %d endpoints kept (endpointsMax %d)", next.Load(), n, endpointsMax)
	}
}

// TestNotLeaderPingPongBacksOff: two nodes naming each other as leader
// (stale views during an election) make a call back off, not spin.
func TestNotLeaderPingPongBacksOff(t *testing.T) {
	var a, b *fakeNode
	var calls atomic.Int64
	a = newFakeNode(t, funcBackend(func(ctx context.Context, _ tenants.ID, req *proto.Request) *proto.Response {
		calls.Add(1)
		return &proto.Response{Status: proto.StatusNotLeader, Leader: b.addr}
	}))
	b = newFakeNode(t, funcBackend(func(ctx context.Context, _ tenants.ID, req *proto.Request) *proto.Response {
		calls.Add(1)
		return &proto.Response{Status: proto.StatusNotLeader, Leader: a.addr}
	}))
	rs := &recordSleep{}
	c := dial(t, []string{a.addr, b.addr}, Options{Sleep: rs.sleep, RetriesMax: 6})
	if _, err := c.Get(context.Background(), []byte("k")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("get: %v", err)
	}
	// Attempt 0 at a is redirected to b at once; from then on each hint
	// names an address this call already tried.
	if calls.Load() != 7 || len(rs.waits) != 5 {
		t.Fatalf("%d attempts and %d waits; want 7 attempts, 5 waits (%v)", calls.Load(), len(rs.waits), rs.waits)
	}
}

// TestCloseStopsDial: Close ends a dial in progress and the calls waiting
// for it.
func TestCloseStopsDial(t *testing.T) {
	started := make(chan struct{})
	c, err := New([]string{"127.0.0.1:1"}, token, Options{DialTimeout: time.Minute, Dial: func(ctx context.Context, addr string) (net.Conn, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Ping(context.Background()) }()
	<-started
	c.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("ping succeeded on a closed client")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the call waiting for a dial")
	}
	if err := c.Ping(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("ping after close: %v", err)
	}
}
