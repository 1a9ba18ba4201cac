package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/proto"
	"synod/tenants"
)

const (
	tokenA = "token-tenant-a"
	tokenB = "token-tenant-b"
)

func registry(t *testing.T) *tenants.Registry {
	reg, err := tenants.NewRegistry([]tenants.Spec{
		{ID: 1, Name: "a", Token: tokenA},
		{ID: 2, Name: "b", Token: tokenB, MaxValueBytes: 8},
	})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// echoBackend answers GET with "<tenant>:<key>", PUT with OK. When gate is
// set, requests wait until gate is closed, so a test can hold many in flight.
type echoBackend struct {
	gate     chan struct{}
	mu       sync.Mutex
	inflight int
	peak     int
}

func (b *echoBackend) Do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
	b.mu.Lock()
	b.inflight++
	b.peak = max(b.peak, b.inflight)
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.inflight--
		b.mu.Unlock()
	}()
	if b.gate != nil {
		select {
		case <-b.gate:
		case <-ctx.Done():
			return proto.Errorf(proto.StatusUnavailable, "%v", ctx.Err())
		}
	}
	if req.Tenant != tenant {
		return proto.Errorf(proto.StatusInternal, "request tenant %d, connection tenant %d", req.Tenant, tenant)
	}
	switch req.Op {
	case proto.OpGet:
		return &proto.Response{Value: []byte(fmt.Sprintf("%d:%s", tenant, req.Key))}
	}
	return &proto.Response{}
}

func start(t *testing.T, be Backend, cfg Config) (*Server, string) {
	t.Helper()
	return startWith(t, registry(t), be, cfg, zerolog.Nop())
}

// startWith serves reg on be with cfg, logging to log.
func startWith(t *testing.T, reg *tenants.Registry, be Backend, cfg Config, log zerolog.Logger) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(cfg, reg, be, log)
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return s, ln.Addr().String()
}

// rawConn speaks frames by hand.
type rawConn struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc, br: bufio.NewReader(nc)}
}

func (c *rawConn) send(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawConn) recv() (*proto.Response, error) {
	var hb [proto.HeaderBytes]byte
	if _, err := io.ReadFull(c.br, hb[:]); err != nil {
		return nil, err
	}
	h, err := proto.DecodeHeader(hb[:])
	if err != nil {
		return nil, err
	}
	body := make([]byte, h.Length)
	if _, err := io.ReadFull(c.br, body); err != nil {
		return nil, err
	}
	return proto.DecodeResponse(h, body)
}

func (c *rawConn) mustRecv() *proto.Response {
	c.t.Helper()
	r, err := c.recv()
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

// expectClosed checks that the server closed the connection.
func (c *rawConn) expectClosed() {
	c.t.Helper()
	if r, err := c.recv(); err == nil {
		c.t.Fatalf("connection still open; got %v %v", r.Op, r.Status)
	}
}

func (c *rawConn) hello(token string) *proto.Response {
	c.t.Helper()
	c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpHello, ID: 1, Version: proto.Version, Token: token}))
	return c.mustRecv()
}

func TestHandshake(t *testing.T) {
	_, addr := start(t, &echoBackend{}, Config{})
	c := dialRaw(t, addr)
	r := c.hello(tokenB)
	if r.Status != proto.StatusOK || r.Tenant != 2 || r.Version != proto.Version || r.InflightPerConnMax != proto.InflightPerConnMax {
		t.Fatalf("hello: %+v", r)
	}
	c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 2, ID: 5, Key: []byte("x")}))
	if r := c.mustRecv(); r.ID != 5 || string(r.Value) != "2:x" {
		t.Fatalf("get: %+v", r)
	}
}

func TestUnauthorized(t *testing.T) {
	_, addr := start(t, &echoBackend{}, Config{})

	c := dialRaw(t, addr)
	if r := c.hello("wrong-token-123"); r.Status != proto.StatusUnauthorized {
		t.Fatalf("bad token: %v", r.Status)
	}
	c.expectClosed()

	c = dialRaw(t, addr)
	c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: 3, Key: []byte("k")}))
	if r := c.mustRecv(); r.Status != proto.StatusUnauthorized || r.ID != 3 {
		t.Fatalf("request before hello: %+v", r)
	}
	c.expectClosed()

	// Authenticated as tenant 1, a frame naming tenant 2 is refused and
	// the connection closed: a token never reaches another tenant's keys.
	c = dialRaw(t, addr)
	c.hello(tokenA)
	c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 2, ID: 4, Key: []byte("k")}))
	if r := c.mustRecv(); r.Status != proto.StatusUnauthorized {
		t.Fatalf("cross-tenant header: %v", r.Status)
	}
	c.expectClosed()
}

func TestPipelining(t *testing.T) {
	be := &echoBackend{gate: make(chan struct{})}
	_, addr := start(t, be, Config{})
	c := dialRaw(t, addr)
	c.hello(tokenA)
	const n = 64
	var frames []byte
	for i := 0; i < n; i++ {
		frames = proto.AppendRequest(frames, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(100 + i), Key: []byte(fmt.Sprint(i))})
	}
	c.send(frames) // all at once, without waiting for any answer
	// Every request must reach the backend before any is answered.
	for {
		be.mu.Lock()
		in := be.inflight
		be.mu.Unlock()
		if in == n {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(be.gate)
	seen := map[uint64]bool{}
	for i := 0; i < n; i++ {
		r := c.mustRecv()
		want := fmt.Sprintf("1:%d", r.ID-100)
		if r.Status != proto.StatusOK || string(r.Value) != want || seen[r.ID] {
			t.Fatalf("response %d: id %d value %q status %v", i, r.ID, r.Value, r.Status)
		}
		seen[r.ID] = true
	}
	if be.peak != n {
		t.Fatalf("peak in flight %d, want %d", be.peak, n)
	}
}

func TestInflightBounded(t *testing.T) {
	be := &echoBackend{gate: make(chan struct{})}
	_, addr := start(t, be, Config{})
	c := dialRaw(t, addr)
	c.hello(tokenA)
	n := proto.InflightPerConnMax + 40
	go func() {
		var frames []byte
		for i := 0; i < n; i++ {
			frames = proto.AppendRequest(frames, &proto.Request{Op: proto.OpPing + 1, Tenant: 1, ID: uint64(i + 1), Key: []byte("k")})
		}
		c.nc.Write(frames)
	}()
	for {
		be.mu.Lock()
		in := be.inflight
		be.mu.Unlock()
		if in == proto.InflightPerConnMax {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// The reader must not take more than the bound, however long we wait.
	time.Sleep(50 * time.Millisecond)
	close(be.gate)
	for i := 0; i < n; i++ {
		c.mustRecv()
	}
	if be.peak > proto.InflightPerConnMax {
		t.Fatalf("peak in flight %d exceeds %d", be.peak, proto.InflightPerConnMax)
	}
}

func TestBadFramesDoNotHurtOthers(t *testing.T) {
	_, addr := start(t, &echoBackend{}, Config{})
	good := dialRaw(t, addr)
	good.hello(tokenA)

	// A body that does not decode: BAD_REQUEST, connection goes on.
	bad := dialRaw(t, addr)
	bad.hello(tokenA)
	frame := proto.AppendRequest(nil, &proto.Request{Op: proto.OpScan, Tenant: 1, ID: 7, Limit: 10})
	frame[len(frame)-1] = 0 // limit 0
	frame[len(frame)-2] = 0
	bad.send(frame)
	if r := bad.mustRecv(); r.Status != proto.StatusBadRequest || r.ID != 7 {
		t.Fatalf("bad body: %+v", r)
	}
	bad.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpPing, Tenant: 1, ID: 8}))
	if r := bad.mustRecv(); r.Status != proto.StatusOK || r.ID != 8 {
		t.Fatalf("ping after bad body: %+v", r)
	}
	// A value over the tenant's own limit: TOO_LARGE.
	b2 := dialRaw(t, addr)
	b2.hello(tokenB)
	b2.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpPut, Tenant: 2, ID: 9, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("123456789")}))
	if r := b2.mustRecv(); r.Status != proto.StatusTooLarge {
		t.Fatalf("value over tenant limit: %v", r.Status)
	}
	// A header that does not decode: answered, then closed.
	bad2 := dialRaw(t, addr)
	bad2.hello(tokenA)
	hdr := proto.AppendHeader(nil, proto.Header{Op: 200, Tenant: 1, ID: 11})
	bad2.send(hdr)
	if r := bad2.mustRecv(); r.Status != proto.StatusBadRequest {
		t.Fatalf("bad header: %v", r.Status)
	}
	bad2.expectClosed()
	// An oversized length: TOO_LARGE, then closed.
	bad3 := dialRaw(t, addr)
	bad3.hello(tokenA)
	bad3.send(proto.AppendHeader(nil, proto.Header{Length: proto.FrameBytesMax, Op: proto.OpPut, Tenant: 1, ID: 12}))
	if r := bad3.mustRecv(); r.Status != proto.StatusTooLarge {
		t.Fatalf("oversized frame: %v", r.Status)
	}
	bad3.expectClosed()
	// Garbage before the handshake.
	bad4 := dialRaw(t, addr)
	bad4.send([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	if r := bad4.mustRecv(); r.Op != proto.OpNone || r.Status != proto.StatusTooLarge {
		t.Fatalf("garbage: %v %v", r.Op, r.Status)
	}
	bad4.expectClosed()

	// The good connection never noticed.
	good.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: 99, Key: []byte("still")}))
	if r := good.mustRecv(); r.Status != proto.StatusOK || string(r.Value) != "1:still" {
		t.Fatalf("good connection: %+v", r)
	}
}

type denyAll struct{ calls int }

func (d *denyAll) Admit(tenant tenants.ID, op proto.Opcode, frameBytes int) (bool, time.Duration) {
	d.calls++
	return op == proto.OpGet, 1500 * time.Microsecond
}

func TestAdmitterThrottles(t *testing.T) {
	adm := &denyAll{}
	_, addr := start(t, &echoBackend{}, Config{Admitter: adm})
	c := dialRaw(t, addr)
	c.hello(tokenA)
	c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpPut, Tenant: 1, ID: 1, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("v")}))
	if r := c.mustRecv(); r.Status != proto.StatusThrottled || r.RetryAfter != 1500*time.Microsecond {
		t.Fatalf("throttled put: %+v", r)
	}
	// The body was skipped, not misread as the next frame.
	c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: 2, Key: []byte("k")}))
	if r := c.mustRecv(); r.Status != proto.StatusOK || r.ID != 2 {
		t.Fatalf("get after throttled put: %+v", r)
	}
}

func TestCloseEndsEverything(t *testing.T) {
	be := &echoBackend{gate: make(chan struct{})}
	s, addr := start(t, be, Config{})
	c := dialRaw(t, addr)
	c.hello(tokenA)
	c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: 1, Key: []byte("k")}))
	for {
		be.mu.Lock()
		in := be.inflight
		be.mu.Unlock()
		if in == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return with a request in flight")
	}
	c.expectClosed()
}

// TestConnsMax: past the node's cap on authenticated connections a HELLO
// is answered UNAVAILABLE and the connection closed.
func TestConnsMax(t *testing.T) {
	_, addr := start(t, &echoBackend{}, Config{ConnsMax: 2, ConnsPerTenantMax: 2})
	for i := 0; i < 2; i++ {
		if r := dialRaw(t, addr).hello(tokenA); r.Status != proto.StatusOK {
			t.Fatal(r.Status)
		}
	}
	third := dialRaw(t, addr)
	if r := third.hello(tokenB); r.Status != proto.StatusUnavailable {
		t.Fatalf("HELLO past conns_max: %v %s", r.Status, r.Message)
	}
	third.expectClosed()
}

// TestOversizedRequestSkipped walks the request-body limit byte by byte: a
// frame at RequestBodyBytesMax is decoded and served, one or two bytes
// over it is answered TOO_LARGE without its body being buffered, and the
// connection stays usable.
func TestOversizedRequestSkipped(t *testing.T) {
	_, addr := start(t, &echoBackend{}, Config{})
	c := dialRaw(t, addr)
	hello := c.hello(tokenA)
	for over := -1; over <= 2; over++ {
		put := &proto.Request{Op: proto.OpPut, Tenant: hello.Tenant, ID: uint64(10 + over), ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k")}
		base := len(proto.AppendRequestBody(nil, put))
		if over <= 0 {
			put.Value = make([]byte, proto.RequestBodyBytesMax-base+over)
			if len(put.Value) > proto.ValueBytesMax { // a 1-byte key leaves room above ValueBytesMax: fill with the key
				put.Key = make([]byte, proto.RequestBodyBytesMax-base+over-proto.ValueBytesMax+1)
				put.Value = put.Value[:proto.ValueBytesMax]
			}
		} else {
			put.Key = make([]byte, proto.KeyBytesMax)
			put.Value = make([]byte, proto.ValueBytesMax)
			put.Value = append(put.Value, make([]byte, over)...) // the body is over by `over` bytes
		}
		frame := proto.AppendRequest(nil, put)
		if got := len(frame) - proto.HeaderBytes - proto.RequestBodyBytesMax; got != over && over > 0 {
			t.Fatalf("built a body %d bytes over, want %d", got, over)
		}
		c.send(frame)
		resp := c.mustRecv()
		switch {
		case over <= 0 && resp.Status != proto.StatusOK:
			t.Fatalf("body %+d bytes from the limit: %v %s", over, resp.Status, resp.Message)
		case over > 0 && resp.Status != proto.StatusTooLarge:
			t.Fatalf("body %+d bytes over the limit: %v, want TOO_LARGE", over, resp.Status)
		}
	}
	c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpPing, Tenant: hello.Tenant, ID: 99}))
	if resp := c.mustRecv(); resp.Status != proto.StatusOK || resp.ID != 99 {
		t.Fatalf("the connection did not survive: %+v", resp)
	}
	// Refused from its header: the answer comes before the body is sent
	// (a client may wait for it before sending a large body), and the
	// body sent after it is read past.
	const announced = 2_000_000
	c.send(proto.AppendHeader(nil, proto.Header{Length: announced, Op: proto.OpPut, Tenant: hello.Tenant, ID: 100}))
	c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if resp := c.mustRecv(); resp.Status != proto.StatusTooLarge || resp.ID != 100 {
		t.Fatalf("a header announcing a %d-byte body, before the body: %v %s, want TOO_LARGE", announced, resp.Status, resp.Message)
	}
	c.nc.SetDeadline(time.Now().Add(30 * time.Second))
	c.send(make([]byte, announced))
	c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpPing, Tenant: hello.Tenant, ID: 101}))
	if resp := c.mustRecv(); resp.Status != proto.StatusOK || resp.ID != 101 {
		t.Fatalf("after a refused header's body: %+v", resp)
	}
	if int(hello.FrameBytesMax) != proto.RequestFrameBytesMax {
		t.Fatalf("HELLO reports frame bytes max %d, want %d", hello.FrameBytesMax, proto.RequestFrameBytesMax)
	}
}
