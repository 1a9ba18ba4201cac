package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"synod/kv/proto"
	"synod/tenants"
)

// The hostile-input attacks on the client port, each reproduced at unit
// level with the harm it used to do checked absent. No assertion depends
// on speed: waits are polls with generous deadlines.

// pollTimeout bounds every wait for a condition in these tests: 20 s, and
// 3x that under the race detector, which runs their megabyte traffic
// 10-15x slower (race_test.go).
const pollTimeout = 20 * time.Second * raceSlowdown

// eventually polls cond until it holds or pollTimeout passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(pollTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, pollTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settled waits until f stops changing for settledFor (then the server
// has done what it will do with what it was sent), within pollTimeout.
func settled(t *testing.T, what string, f func() int64) {
	t.Helper()
	const settledFor = 400 * time.Millisecond // above refusedPaceMax: a paced reader's next frame
	deadline := time.Now().Add(pollTimeout)
	last, since := f(), time.Now()
	for time.Since(since) < settledFor {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still changing after %v", what, pollTimeout)
		}
		time.Sleep(10 * time.Millisecond)
		if v := f(); v != last {
			last, since = v, time.Now()
		}
	}
}

// victimServed checks that a fresh connection of token authenticates and
// gets a GET answered.
func victimServed(t *testing.T, addr, token string, tenant tenants.ID) {
	t.Helper()
	v := dialRaw(t, addr)
	if r := v.hello(token); r.Status != proto.StatusOK {
		t.Fatalf("victim HELLO: %v %s", r.Status, r.Message)
	}
	v.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: tenant, ID: 2, Key: []byte("v")}))
	if r := v.mustRecv(); r.Status != proto.StatusOK {
		t.Fatalf("victim GET: %v %s", r.Status, r.Message)
	}
	v.nc.Close()
}

// TestTenantConnCap: one tenant opening more connections than its cap is
// refused (THROTTLED, closed) while another tenant still connects, and a
// slot freed by a close can be used again.
func TestTenantConnCap(t *testing.T) {
	s, addr := start(t, &echoBackend{}, Config{ConnsMax: 8, ConnsPerTenantMax: 3})
	var held []*rawConn
	for i := 0; i < 3; i++ {
		c := dialRaw(t, addr)
		if r := c.hello(tokenA); r.Status != proto.StatusOK {
			t.Fatalf("connection %d: %v", i, r.Status)
		}
		held = append(held, c)
	}
	for i := 0; i < 5; i++ {
		over := dialRaw(t, addr)
		r := over.hello(tokenA)
		if r.Status != proto.StatusThrottled || r.RetryAfter < RetryAfterMin {
			t.Fatalf("HELLO over the tenant's cap: %v retry %v %s", r.Status, r.RetryAfter, r.Message)
		}
		over.expectClosed()
	}
	victimServed(t, addr, tokenB, 2)
	if st := s.Stats(); st.ConnsRefused != 5 {
		t.Fatalf("refused %d, want 5", st.ConnsRefused)
	}
	held[0].nc.Close()
	eventually(t, "the closed connection's slot is given back", func() bool { return s.Stats().ConnsAuthenticated == 2 })
	victimServed(t, addr, tokenA, 1)
}

// TestPreHelloFloodDoesNotLockOut: connections that never complete HELLO
// (silent, or trickling a header) fill the pre-HELLO pool; new ones evict
// the oldest, so a real client still authenticates, every time.
func TestPreHelloFloodDoesNotLockOut(t *testing.T) {
	const pool = 8
	s, addr := start(t, &echoBackend{}, Config{ConnsUnauthenticatedMax: pool, ConnsPerSourceMax: 1000})
	var flood []net.Conn
	defer func() {
		for _, nc := range flood {
			nc.Close()
		}
	}()
	for round := 0; round < 5; round++ {
		for i := 0; i < 4*pool; i++ {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			nc.Write([]byte{0, 0}) // the start of a header, never finished
			flood = append(flood, nc)
		}
		victimServed(t, addr, tokenA, 1)
		if st := s.Stats(); st.ConnsUnauthenticated > pool {
			t.Fatalf("%d pre-HELLO connections, pool %d", st.ConnsUnauthenticated, pool)
		}
	}
	if st := s.Stats(); st.ConnsEvicted < 4*pool {
		t.Fatalf("evicted %d pre-HELLO connections, want >= %d", st.ConnsEvicted, 4*pool)
	}
}

// TestSourceCap: a source address full of authenticated connections is
// refused at accept; one whose excess is pre-HELLO loses its oldest
// pre-HELLO connection instead.
func TestSourceCap(t *testing.T) {
	s, addr := start(t, &echoBackend{}, Config{ConnsMax: 64, ConnsPerTenantMax: 16, ConnsPerSourceMax: 3})
	a1, a2 := dialRaw(t, addr), dialRaw(t, addr)
	a1.hello(tokenA)
	a2.hello(tokenB)
	silent := dialRaw(t, addr)
	eventually(t, "the silent connection is registered", func() bool { return s.Stats().ConnsUnauthenticated == 1 })
	// The source is full (2 authenticated, 1 pre-HELLO): the new one
	// evicts the silent one and authenticates.
	victimServed(t, addr, tokenA, 1)
	silent.expectClosed()
	eventually(t, "the victim's slot is given back", func() bool { return s.Stats().ConnsAuthenticated == 2 })
	a3 := dialRaw(t, addr)
	a3.hello(tokenA)
	// Now three authenticated connections: a fourth is closed at accept.
	refused := dialRaw(t, addr)
	refused.expectClosed()
	if st := s.Stats(); st.ConnsRefused != 1 || st.ConnsEvicted != 1 {
		t.Fatalf("refused %d evicted %d, want 1 and 1", st.ConnsRefused, st.ConnsEvicted)
	}
}

// TestIdleTimeout: an authenticated connection that sends nothing is
// closed after IdleTimeout, but not while a request is in flight, and not
// while it keeps sending.
func TestIdleTimeout(t *testing.T) {
	be := &echoBackend{gate: make(chan struct{})}
	const idle = time.Second
	_, addr := start(t, be, Config{IdleTimeout: idle, RequestTimeout: time.Minute})

	quiet := dialRaw(t, addr)
	quiet.hello(tokenA)

	busy := dialRaw(t, addr)
	busy.hello(tokenA)
	busy.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: 7, Key: []byte("slow")}))

	chatty := dialRaw(t, addr)
	chatty.hello(tokenA)

	// The chatty connection sends something well within each idle
	// timeout, for longer than one; meanwhile the busy one waits for its
	// answer.
	for i := 0; i < 15; i++ {
		chatty.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpPing, Tenant: 1, ID: uint64(i)}))
		if r := chatty.mustRecv(); r.Status != proto.StatusOK {
			t.Fatal(r.Status)
		}
		time.Sleep(idle / 10)
	}
	quiet.expectClosed()
	close(be.gate)
	if r := busy.mustRecv(); r.Status != proto.StatusOK || r.ID != 7 {
		t.Fatalf("busy connection: %+v", r)
	}
	busy.expectClosed() // idle again, and now nothing is in flight
}

// TestFrameTimeout: a frame whose bytes trickle in (a partial header, a
// partial body) closes the connection after FrameTimeout, and a HELLO
// that never completes closes it after HandshakeTimeout.
func TestFrameTimeout(t *testing.T) {
	cfg := Config{FrameTimeout: 200 * time.Millisecond, HandshakeTimeout: 200 * time.Millisecond, IdleTimeout: time.Hour}
	_, addr := start(t, &echoBackend{}, cfg)

	hello := dialRaw(t, addr)
	hello.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpHello, ID: 1, Version: proto.Version, Token: tokenA})[:10])
	hello.expectClosed()

	header := dialRaw(t, addr)
	header.hello(tokenA)
	frame := proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: 3, Key: []byte("key")})
	header.send(frame[:7])
	header.expectClosed()

	body := dialRaw(t, addr)
	body.hello(tokenA)
	put := proto.AppendRequest(nil, &proto.Request{Op: proto.OpPut, Tenant: 1, ID: 4, ClientID: 1, Seq: 1, FirstUnacked: 1,
		Key: []byte("k"), Value: make([]byte, 200<<10)})
	// Every byte but the last, in pieces, each well within the timeout:
	// the frame as a whole is not.
	for off := 0; off < len(put)-1; {
		n := min(len(put)-1-off, 32<<10)
		if _, err := body.nc.Write(put[off : off+n]); err != nil {
			break // already closed
		}
		off += n
		time.Sleep(50 * time.Millisecond)
	}
	body.expectClosed()

	// An idle gap between whole frames is not a slow frame.
	ok := dialRaw(t, addr)
	ok.hello(tokenA)
	time.Sleep(3 * cfg.FrameTimeout)
	ok.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpPing, Tenant: 1, ID: 9}))
	if r := ok.mustRecv(); r.Status != proto.StatusOK {
		t.Fatal(r.Status)
	}
}

// TestHelloNonZeroTenant: the HELLO header must carry tenant 0.
func TestHelloNonZeroTenant(t *testing.T) {
	_, addr := start(t, &echoBackend{}, Config{})
	c := dialRaw(t, addr)
	c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpHello, Tenant: 1, ID: 1, Version: proto.Version, Token: tokenA}))
	if r := c.mustRecv(); r.Status != proto.StatusBadRequest {
		t.Fatalf("HELLO with tenant 1 in its header: %v %s", r.Status, r.Message)
	}
	c.expectClosed()
}

// TestHelloTokenBoundary walks a HELLO's token length byte by byte across
// TokenBytesMax: up to the limit an unknown token is UNAUTHORIZED (and a
// known token of exactly the limit is accepted); past it the answer is
// TOO_LARGE, as docs/protocol.md's limit table says, and the connection
// closes. The same for HELLO bodies padded past the limit with trailing
// bytes: BAD_REQUEST up to the body limit, TOO_LARGE past it.
func TestHelloTokenBoundary(t *testing.T) {
	long := strings.Repeat("k", proto.TokenBytesMax)
	reg, err := tenants.NewRegistry([]tenants.Spec{
		{ID: 1, Name: "a", Token: tokenA},
		{ID: 9, Name: "long", Token: long},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, addr := startWith(t, reg, &echoBackend{}, Config{}, zerolog.Nop())
	for n := proto.TokenBytesMax - 2; n <= proto.TokenBytesMax+2; n++ {
		token := strings.Repeat("x", n)
		want := proto.StatusUnauthorized
		if n > proto.TokenBytesMax {
			want = proto.StatusTooLarge
		}
		c := dialRaw(t, addr)
		if r := c.hello(token); r.Status != want {
			t.Fatalf("HELLO with a %d-byte token: %v %q, want %v", n, r.Status, r.Message, want)
		}
		c.expectClosed()
	}
	c := dialRaw(t, addr)
	if r := c.hello(long); r.Status != proto.StatusOK || r.Tenant != 9 {
		t.Fatalf("HELLO with a known %d-byte token: %v %q", len(long), r.Status, r.Message)
	}
	// A valid HELLO followed by trailing bytes in its body.
	valid := proto.AppendRequest(nil, &proto.Request{Op: proto.OpHello, ID: 1, Version: proto.Version, Token: tokenA})
	for _, body := range []int{handshakeBodyBytesMax, handshakeBodyBytesMax + 1, handshakeDiscardBytesMax, handshakeDiscardBytesMax + 1} {
		pad := body - (len(valid) - proto.HeaderBytes)
		frame := append(append([]byte(nil), valid...), make([]byte, pad)...)
		binary.BigEndian.PutUint32(frame[0:4], uint32(body)) // the header's length field
		want := proto.StatusBadRequest
		if body > handshakeBodyBytesMax {
			want = proto.StatusTooLarge
		}
		c := dialRaw(t, addr)
		c.send(frame)
		r, err := c.recv()
		if body > handshakeDiscardBytesMax && err != nil {
			continue // answered at once, unread bytes: a reset may win
		}
		if err != nil {
			t.Fatalf("HELLO body of %d bytes: %v", body, err)
		}
		if r.Status != want {
			t.Fatalf("HELLO body of %d bytes: %v %q, want %v", body, r.Status, r.Message, want)
		}
		c.expectClosed()
	}
}

// shaperAdmitter adapts tenants.Shaper as kvnode does.
type shaperAdmitter struct{ s *tenants.Shaper }

func (a shaperAdmitter) Admit(id tenants.ID, op proto.Opcode, n int) (bool, time.Duration) {
	return a.s.Admit(id, uint8(op), n)
}

// TestFrameOverBytesBurst: a frame larger than the tenant's bytes_burst
// can never be admitted by its bucket: it is answered TOO_LARGE at once
// (not THROTTLED, not left waiting), the connection goes on, and HELLO
// reports the tenant's frame limit.
func TestFrameOverBytesBurst(t *testing.T) {
	reg, err := tenants.NewRegistry([]tenants.Spec{{ID: 3, Name: "c", Token: "token-tenant-c", BytesPerSec: 1000, BytesBurst: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	_, addr := startWith(t, reg, &echoBackend{}, Config{Admitter: shaperAdmitter{tenants.NewShaper(reg, time.Now, nil)}}, zerolog.Nop())
	c := dialRaw(t, addr)
	if r := c.hello("token-tenant-c"); r.FrameBytesMax != 4096 {
		t.Fatalf("HELLO reports frame bytes max %d, want the tenant's 4096", r.FrameBytesMax)
	}
	put := func(id uint64, n int) *proto.Response {
		c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpPut, Tenant: 3, ID: id, ClientID: 1, Seq: id, FirstUnacked: id,
			Key: []byte("k"), Value: make([]byte, n)}))
		return c.mustRecv()
	}
	if r := put(1, 5000); r.Status != proto.StatusTooLarge || !strings.Contains(r.Message, "bytes_burst") {
		t.Fatalf("frame over the burst: %v %s", r.Status, r.Message)
	}
	if r := put(2, 1000); r.Status != proto.StatusOK {
		t.Fatalf("frame within the burst: %v %s", r.Status, r.Message)
	}
}

type fixedAdmitter struct{ retry time.Duration }

func (a fixedAdmitter) Admit(tenants.ID, proto.Opcode, int) (bool, time.Duration) {
	return false, a.retry
}

// TestRetryAfterFloor: a retry-after of a few microseconds is raised to
// RetryAfterMin; a longer one is passed on.
func TestRetryAfterFloor(t *testing.T) {
	for _, tc := range []struct{ given, want time.Duration }{
		{150 * time.Microsecond, RetryAfterMin},
		{0, RetryAfterMin},
		{40 * time.Millisecond, 40 * time.Millisecond},
	} {
		_, addr := start(t, &echoBackend{}, Config{Admitter: fixedAdmitter{tc.given}})
		c := dialRaw(t, addr)
		c.hello(tokenA)
		c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: 1, Key: []byte("k")}))
		if r := c.mustRecv(); r.Status != proto.StatusThrottled || r.RetryAfter != tc.want {
			t.Fatalf("admitter retry %v: %v retry %v, want %v", tc.given, r.Status, r.RetryAfter, tc.want)
		}
	}
}

// bigBackend answers every SCAN with scanBytes of pairs and every GET with
// a value of getBytes, counting the requests it executed.
type bigBackend struct {
	pairs       []proto.KV
	value       []byte
	scans, gets atomic.Int64
	// copies counts GET values copied: a GET asks ValueRoom first, as the
	// state machine does, and copies nothing when refused.
	copies atomic.Int64
	// lastScanLimit is the limit of the last SCAN it ran.
	lastScanLimit atomic.Int64
}

func newBigBackend(scanBytes, getBytes int) *bigBackend {
	b := &bigBackend{value: bytes.Repeat([]byte("v"), getBytes)}
	const pairBytes = 256 << 10
	for i := 0; i*pairBytes < scanBytes; i++ {
		b.pairs = append(b.pairs, proto.KV{Key: []byte(fmt.Sprintf("k%04d", i)), Value: bytes.Repeat([]byte("s"), pairBytes)})
	}
	return b
}

func (b *bigBackend) Do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
	switch req.Op {
	case proto.OpScan:
		// As kv/sm's scan: the room check before each pair is copied.
		b.scans.Add(1)
		b.lastScanLimit.Store(int64(req.Limit))
		var pairs []proto.KV
		n := 0
		for _, kv := range b.pairs[:min(len(b.pairs), int(max(1, req.Limit)))] {
			n += 2 + len(kv.Key) + 4 + len(kv.Value)
			if room := ValueRoom(ctx); room != nil {
				if r := room(n); r != nil {
					if len(pairs) == 0 {
						return r
					}
					break
				}
			}
			b.copies.Add(1)
			pairs = append(pairs, proto.KV{Key: bytes.Clone(kv.Key), Value: bytes.Clone(kv.Value)})
		}
		return &proto.Response{Pairs: pairs, More: true}
	case proto.OpGet:
		b.gets.Add(1)
		if room := ValueRoom(ctx); room != nil {
			if r := room(len(b.value)); r != nil {
				return r
			}
		}
		b.copies.Add(1)
		return &proto.Response{Value: bytes.Clone(b.value)}
	}
	return &proto.Response{}
}

// connPeaks returns the highest response-budget peak of s's connections.
func connPeaks(s *Server) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var p int64
	for c := range s.conns {
		p = max(p, c.queued.peak.Load())
	}
	return p
}

// pipelineScans sends n SCANs on c and never reads the answers.
func pipelineScans(c *rawConn, tenant tenants.ID, n int) {
	var frames []byte
	for i := 0; i < n; i++ {
		frames = proto.AppendRequest(frames, &proto.Request{Op: proto.OpScan, Tenant: tenant, ID: uint64(100 + i), Limit: proto.ScanLimitMax})
	}
	go c.nc.Write(frames) // blocks once the server stops reading
}

// pipelineGets sends n GETs of "big" on c and never reads the answers.
func pipelineGets(c *rawConn, tenant tenants.ID, n int) {
	var frames []byte
	for i := 0; i < n; i++ {
		frames = proto.AppendRequest(frames, &proto.Request{Op: proto.OpGet, Tenant: tenant, ID: uint64(i + 1), Key: []byte("big")})
	}
	go c.nc.Write(frames) // blocks once the server stops reading
}

// TestScanPipelineWithoutReading: connections pipelining 256 SCANs of
// 2 MiB each and never reading their socket. The server refuses the pairs
// the budgets have no room for before they are copied, so a few dozen
// pairs are copied instead of all 768 scans' 6144, the bytes queued stay within the connection's, tenant's and
// node's bounds, another tenant is served meanwhile, and everything is
// given back when the attackers go.
func TestScanPipelineWithoutReading(t *testing.T) {
	be := newBigBackend(2<<20, 0)
	const attackers = 3
	cfg := Config{
		WriteTimeout:              2 * time.Second,
		ConnsMax:                  16,
		ResponseBytesPerConnMax:   2 * ResponseBytesPerConnMin,
		ResponseBytesPerTenantMax: 3 * ResponseBytesPerConnMin,
		ResponseBytesPerNodeMax:   5 * ResponseBytesPerConnMin,
	}
	s, addr := start(t, be, cfg)
	var conns []*rawConn
	for i := 0; i < attackers; i++ {
		c := dialRaw(t, addr)
		c.hello(tokenA)
		pipelineScans(c, 1, proto.InflightPerConnMax)
		conns = append(conns, c)
	}
	// Wait until the attack is stuck: the tenant's budget is full.
	eventually(t, "the tenant's response budget refuses a SCAN", func() bool { return s.Stats().ResponsesThrottled > 0 })
	victim := dialRaw(t, addr)
	victim.hello(tokenB)
	victim.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpScan, Tenant: 2, ID: 1, Limit: 10}))
	if r := victim.mustRecv(); r.Status != proto.StatusOK || len(r.Pairs) == 0 {
		t.Fatalf("victim SCAN during the attack: %v %s", r.Status, r.Message)
	}
	st := s.Stats()
	t.Logf("scans run %d, pairs copied %d, stats %+v", be.scans.Load(), be.copies.Load(), st)
	// The tenant's budget holds what it allows, the kernel's socket
	// buffers (a few MiB a connection on loopback) what was written; the
	// rest are THROTTLED before their first pair is copied. Without the
	// bound all 768 would copy 8 pairs (2 MiB) each.
	copied := be.copies.Load() * int64(len(be.pairs[0].Value))
	if bound := cfg.ResponseBytesPerTenantMax + attackers*8<<20; copied > bound {
		t.Fatalf("%d bytes of pairs copied for %d connections that never read; bound %d", copied, attackers, bound)
	}
	if p := connPeaks(s); p > cfg.ResponseBytesPerConnMax {
		t.Fatalf("a connection held %d response bytes, bound %d", p, cfg.ResponseBytesPerConnMax)
	}
	if st.ResponseBytesPeak > cfg.ResponseBytesPerNodeMax {
		t.Fatalf("the node held %d response bytes, bound %d", st.ResponseBytesPeak, cfg.ResponseBytesPerNodeMax)
	}
	// WriteTimeout without progress closes the attackers (only the
	// victim is left), and not one more scan runs for them.
	for _, c := range conns {
		c.nc.Close()
	}
	victim.nc.Close()
	eventually(t, "every budget is given back", func() bool { return s.Stats().ResponseBytes == 0 })
}

// TestLargeAnswersWithoutReading: GETs of the largest values pipelined without
// reading: answers that do not fit the connection's budget are replaced
// by THROTTLED, so the budget is never exceeded; a client that reads gets
// its large values.
func TestLargeAnswersWithoutReading(t *testing.T) {
	be := newBigBackend(0, proto.ValueBytesMax)
	cfg := Config{ResponseBytesPerConnMax: ResponseBytesPerConnMin, WriteTimeout: 2 * time.Second}
	s, addr := start(t, be, cfg)
	a := dialRaw(t, addr)
	a.hello(tokenA)
	pipelineGets(a, 1, proto.InflightPerConnMax)
	eventually(t, "some answers are refused", func() bool { return s.Stats().ResponsesThrottled > 0 })
	if p := connPeaks(s); p > cfg.ResponseBytesPerConnMax {
		t.Fatalf("a connection held %d response bytes, bound %d", p, cfg.ResponseBytesPerConnMax)
	}
	reader := dialRaw(t, addr)
	reader.hello(tokenB)
	for i := 0; i < 8; i++ {
		reader.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 2, ID: uint64(i), Key: []byte("big")}))
		if r := reader.mustRecv(); r.Status != proto.StatusOK || len(r.Value) != proto.ValueBytesMax {
			t.Fatalf("reading client: %v, %d bytes", r.Status, len(r.Value))
		}
	}
	a.nc.Close()
	reader.nc.Close()
	eventually(t, "every budget is given back", func() bool { return s.Stats().ResponseBytes == 0 })
}

// TestThrottledNamesTheFullBudget: a charge that does not fit names the
// budget without room, and takes nothing from any budget then; the
// THROTTLED message for each names its key, and only the connection's
// tells the client to read its answers (an outside tester's reader, which
// read every answer, was told to when other tenants filled the node).
func TestThrottledNamesTheFullBudget(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name                  string
		connUsed, tenantUsed  int64
		nodeUsed              int64
		want                  budgetFull
		wantKey               string
		tellsToReadItsAnswers bool
	}{
		{"room everywhere", 0, 0, 0, budgetNone, "", false},
		{"connection full", 3 * mib, 3 * mib, 3 * mib, budgetConn, "response_bytes_per_conn_max", true},
		{"tenant full", 0, 7 * mib, 7 * mib, budgetTenant, "response_bytes_per_tenant_max", false},
		{"node full", 0, 0, 15 * mib, budgetNode, "response_bytes_per_node_max", false},
	} {
		c := &conn{queued: newBudget(4 * mib), tbudget: newBudget(8 * mib), s: &Server{node: newBudget(16 * mib)}}
		c.queued.used.Store(tc.connUsed)
		c.tbudget.used.Store(tc.tenantUsed)
		c.s.node.used.Store(tc.nodeUsed)
		got := c.tryChargeOrFull(2 * mib)
		if got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
			continue
		}
		wantAfter := [3]int64{tc.connUsed, tc.tenantUsed, tc.nodeUsed}
		if got == budgetNone {
			wantAfter = [3]int64{2 * mib, 2 * mib, 2 * mib}
		}
		if after := [3]int64{c.queued.used.Load(), c.tbudget.used.Load(), c.s.node.used.Load()}; after != wantAfter {
			t.Errorf("%s: budgets hold %v after the charge, want %v", tc.name, after, wantAfter)
		}
		if got == budgetNone {
			continue
		}
		msg := got.refusal()
		if !strings.Contains(msg, tc.wantKey) || strings.Contains(msg, "read the connection's answers") != tc.tellsToReadItsAnswers {
			t.Errorf("%s: refusal %q", tc.name, msg)
		}
	}
}

// TestGetValuesNotCopiedWithoutRoom: 256 pipelined GETs of the largest
// value whose answers are never read copy only the values the connection's
// response budget can hold; the others are THROTTLED before their value is
// copied (they used to copy it and then be refused: 256 MiB per
// connection).
func TestGetValuesNotCopiedWithoutRoom(t *testing.T) {
	be := newBigBackend(0, proto.ValueBytesMax)
	cfg := Config{ResponseBytesPerConnMax: ResponseBytesPerConnMin, WriteTimeout: 5 * time.Second}
	s, addr := start(t, be, cfg)
	a := dialRaw(t, addr)
	a.hello(tokenA)
	pipelineGets(a, 1, proto.InflightPerConnMax)
	// Wait until the server is done with the pipeline: every GET answered,
	// or the connection's budget full of unwritten answers (the values
	// that fit and the THROTTLED answers after them) so that it reads no
	// more. How many refusals that takes depends on the order the reader
	// and the GETs ran in: with the values charged first, the budget's
	// last ~13 KB holds fewer than 100 THROTTLED answers (CI once stopped
	// there, and a wait for 100 refusals timed out).
	eventually(t, "GETs refused", func() bool { return s.Stats().ResponsesThrottled >= 1 })
	settled(t, "the pipeline", func() int64 { return be.gets.Load() + int64(s.Stats().ResponsesThrottled) })
	// The budget holds fit answers at once; the kernel's socket buffers
	// take a few more off it before the writer blocks.
	fit := cfg.ResponseBytesPerConnMax/getAnswerBytesMax(proto.ValueBytesMax) + 1
	if got := be.copies.Load(); got > fit+8 {
		t.Fatalf("%d values copied for %d GETs; the connection's budget holds %d answers", got, be.gets.Load(), fit)
	}
	if p := connPeaks(s); p > cfg.ResponseBytesPerConnMax {
		t.Fatalf("a connection held %d response bytes, bound %d", p, cfg.ResponseBytesPerConnMax)
	}
	a.nc.Close()
	eventually(t, "every budget is given back", func() bool { return s.Stats().ResponseBytes == 0 })
	t.Logf("gets %d, copies %d, throttled %d", be.gets.Load(), be.copies.Load(), s.Stats().ResponsesThrottled)
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fakeClock is a clock tests move by hand.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestBadAuthLogRateLimited: a flood of connections with a bad token logs
// at most logLinesPerSecMax warnings a second; the next line let through
// says how many were suppressed.
func TestBadAuthLogRateLimited(t *testing.T) {
	var sink syncBuffer
	clk := &fakeClock{}
	clk.Advance(time.Hour)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{}, registry(t), &echoBackend{}, zerolog.New(&sink))
	s.warnLog.now = clk.Now
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	addr := ln.Addr().String()

	badConn := func() {
		c := dialRaw(t, addr)
		if r := c.hello("not-a-valid-token"); r.Status != proto.StatusUnauthorized {
			t.Fatal(r.Status)
		}
		c.expectClosed()
	}
	const flood = 3 * logLinesPerSecMax
	for i := 0; i < flood; i++ {
		badConn()
	}
	if n := strings.Count(sink.String(), "unknown token"); n != logLinesPerSecMax {
		t.Fatalf("%d lines for %d bad connections in one second, want %d", n, flood, logLinesPerSecMax)
	}
	if got := s.Stats().LogLinesSuppressed; got != flood-logLinesPerSecMax {
		t.Fatalf("%d lines counted as suppressed, want %d", got, flood-logLinesPerSecMax)
	}
	clk.Advance(logWindow)
	badConn()
	want := fmt.Sprintf(`"suppressed":%d`, flood-logLinesPerSecMax)
	if out := sink.String(); strings.Count(out, "unknown token") != logLinesPerSecMax+1 || !strings.Contains(out, want) {
		t.Fatalf("after a second: want one more line carrying %s; log:\n%s", want, out)
	}
}

// TestConfigValidate: relations the server needs are checked.
func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, cfg := range []Config{
		{ConnsMax: 4, ConnsPerTenantMax: 5},
		{ResponseBytesPerConnMax: ResponseBytesPerConnMin - 1},
		{ResponseBytesPerConnMax: 64 << 20, ResponseBytesPerTenantMax: 32 << 20},
		{ResponseBytesPerTenantMax: 512 << 20, ResponseBytesPerNodeMax: 256 << 20},
		{IdleTimeout: time.Microsecond},
		{RequestBytesPerConnMax: RequestBytesPerConnMin - 1},
		{RequestBytesPerConnMax: 32 << 20, RequestBytesPerTenantMax: 32<<20 - 1},
		{RequestBytesPerTenantMax: 64 << 20, RequestBytesPerNodeMax: 64<<20 - 1},
	} {
		if err := cfg.Validate(); err == nil {
			t.Errorf("%+v: accepted", cfg)
		}
	}
	// Each request bound at its least is accepted, and a refusal names its key.
	if err := (Config{RequestBytesPerConnMax: RequestBytesPerConnMin, RequestBytesPerTenantMax: RequestBytesPerConnMin,
		RequestBytesPerNodeMax: RequestBytesPerConnMin}).Validate(); err != nil {
		t.Fatalf("request budgets at their least: %v", err)
	}
	if err := (Config{RequestBytesPerConnMax: 1}).Validate(); err == nil || !strings.Contains(err.Error(), "request_bytes_per_conn_max") {
		t.Fatalf("request_bytes_per_conn_max of 1: %v", err)
	}
}

// TestCollector: the counters reach Prometheus.
func TestCollector(t *testing.T) {
	s, addr := start(t, &echoBackend{}, Config{ConnsMax: 4, ConnsPerTenantMax: 1})
	dialRaw(t, addr).hello(tokenA)
	over := dialRaw(t, addr)
	over.hello(tokenA)
	over.expectClosed()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			if len(m.GetLabel()) > 0 {
				got[mf.GetName()+"/"+m.GetLabel()[0].GetValue()] = v
				continue
			}
			got[mf.GetName()] = v
		}
	}
	if got["synod_client_conns/authenticated"] != 1 || got["synod_client_conns_refused_total"] != 1 {
		t.Fatalf("metrics: %v", got)
	}
	if _, ok := got["synod_client_frames_paced_total"]; !ok || len(got) != 19 {
		t.Fatalf("metrics: %v", got)
	}
	if _, ok := got["synod_client_conns_paced_at_hello_total"]; !ok {
		t.Fatalf("metrics: %v", got)
	}
	for _, name := range []string{"synod_tenant_response_bytes", "synod_tenant_request_bytes", "synod_tenant_budget_throttled_total"} {
		for _, tenant := range []string{"a", "b"} {
			if _, ok := got[name+"/"+tenant]; !ok {
				t.Fatalf("no %s{tenant=%q}: %v", name, tenant, got)
			}
		}
	}
}

// TestOneAtATimeReaderNeverThrottled: a client reading the largest values
// one GET at a time on a connection whose budget holds three of them is
// never THROTTLED, even when the writer is slow to come back from each
// answer (held until the next answer is queued, as on a busy machine):
// each large answer's bytes are given back once the kernel has it, not at
// the end of the writer's burst. Planted (testingUnchargeAtBurstEnd): the
// third GET is THROTTLED.
func TestOneAtATimeReaderNeverThrottled(t *testing.T) {
	for _, planted := range []bool{false, true} {
		got := oneAtATimeThrottled(t, planted)
		t.Logf("planted %v: %d of 12 THROTTLED", planted, got)
		switch {
		case !planted && got != 0:
			t.Fatalf("a one-at-a-time reader: %d of 12 GETs THROTTLED", got)
		case planted && got == 0:
			t.Fatal("planted (bytes given back at the burst's end): no GET THROTTLED; the test does not show the bug")
		}
	}
}

func oneAtATimeThrottled(t *testing.T, planted bool) (throttled int) {
	const gets = 12
	testingUnchargeAtBurstEnd = planted
	// Held until the next answer is queued, however long the client and
	// the server take to get it there on a loaded machine (a 200 ms bound
	// let the planted writer go under -race beside other tests: 0 of 12),
	// but not after the last answer, which no other follows, nor once
	// the connection closes.
	var large atomic.Int32
	testingAfterLargeFrame = func(c *conn, seq uint64) {
		if large.Add(1) >= gets {
			return
		}
		// Until the next answer is sent (queued for the writer, which
		// may hold it waiting for the write token this burst holds).
		for deadline := time.Now().Add(10 * time.Second); c.sends.Load() == seq && c.ctx.Err() == nil && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	defer func() { testingUnchargeAtBurstEnd, testingAfterLargeFrame = false, nil }()
	s, addr := start(t, newBigBackend(0, proto.ValueBytesMax), Config{ResponseBytesPerConnMax: ResponseBytesPerConnMin})
	defer s.Close()
	r := dialRaw(t, addr)
	defer r.nc.Close()
	r.hello(tokenA)
	for i := 0; i < gets; i++ {
		r.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(i + 2), Key: []byte("big")}))
		switch resp := r.mustRecv(); {
		case resp.Status == proto.StatusThrottled:
			throttled++
		case resp.Status != proto.StatusOK || len(resp.Value) != proto.ValueBytesMax:
			t.Fatalf("GET %d: %v %q", i, resp.Status, resp.Message)
		}
	}
	return throttled
}

// TestShorterScanWhenTheBudgetIsShort: a SCAN is charged pair by pair
// (value_room.go), so one whose pairs do not all fit what its tenant's
// response budget has left answers the pairs that do (More set: the
// client goes on), and is THROTTLED only when not even its first pair
// fits; nothing is left charged.
func TestShorterScanWhenTheBudgetIsShort(t *testing.T) {
	be := newBigBackend(2<<20, 0) // 8 pairs of 256 KiB
	pairBytes := int64(2 + len(be.pairs[0].Key) + 4 + len(be.pairs[0].Value))
	cfg := Config{ConnsMax: 16, ResponseBytesPerConnMax: 2 * ResponseBytesPerConnMin}
	cfg.ResponseBytesPerTenantMax = cfg.ResponseBytesPerConnMax + 16*responseBytesReserved
	s, addr := start(t, be, cfg)
	c := dialRaw(t, addr)
	c.hello(tokenA)
	other := s.tenants[1] // what the tenant's other connections would hold
	// free is the tenant's room beside the SCAN's own reservation.
	room := func(pairs int64) int64 {
		return getAnswerBytesMax(int(pairs*pairBytes)) - responseBytesReserved + 8<<10
	}
	for _, tc := range []struct {
		name      string
		free      int64
		wantPairs int // 0: THROTTLED
	}{
		{"room for every pair", cfg.ResponseBytesPerTenantMax - responseBytesReserved, 8},
		{"room for five pairs", room(5), 5},
		{"room for two pairs", room(2), 2},
		{"room for one pair", room(1), 1},
		{"no room for one pair", room(1) - 16<<10, 0},
	} {
		// The last answer's bytes are given back once the writer is
		// done with it, which may be just after the client read it.
		eventually(t, "the last answer given back", func() bool { return other.used.Load() <= responseBytesReserved })
		held := cfg.ResponseBytesPerTenantMax - responseBytesReserved - tc.free
		other.used.Add(held)
		c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpScan, Tenant: 1, ID: 7, Limit: proto.ScanLimitMax}))
		r := c.mustRecv()
		other.used.Add(-held)
		switch {
		case tc.wantPairs == 0 && r.Status != proto.StatusThrottled:
			t.Fatalf("%s: %v, %d pairs, want THROTTLED", tc.name, r.Status, len(r.Pairs))
		case tc.wantPairs == 0 && !strings.Contains(r.Message, "even its first pair"):
			t.Fatalf("%s: THROTTLED %q, want it to name the first pair", tc.name, r.Message)
		case tc.wantPairs > 0 && (r.Status != proto.StatusOK || !r.More || len(r.Pairs) != tc.wantPairs):
			t.Fatalf("%s: %v more=%v %d pairs %q, want OK with More and %d pairs", tc.name, r.Status, r.More, len(r.Pairs), r.Message, tc.wantPairs)
		}
		t.Logf("%s: %v, %d pairs %q", tc.name, r.Status, len(r.Pairs), r.Message)
	}
	c.nc.Close()
	eventually(t, "every budget is given back", func() bool { return s.Stats().ResponseBytes == 0 })
	if n := s.Stats().ResponsesThrottled; n != 1 {
		t.Fatalf("%d answers counted THROTTLED, want 1 (a page ended early is not one)", n)
	}
}

// TestScanOfSmallPairsNotShortened: a SCAN of a thousand small pairs
// beside a tenant budget with 100 KB left answers all thousand. It used
// to reserve the largest answer a thousand pairs may have (3.15 MB)
// before it ran, so its page fell to what that reservation allowed: an
// outside tester's pages of tiny keys fell from 1000 to 2 beside the
// tenant's unread answers, for room they never used.
func TestScanOfSmallPairsNotShortened(t *testing.T) {
	be := &bigBackend{}
	for i := range proto.ScanLimitMax {
		be.pairs = append(be.pairs, proto.KV{Key: []byte(fmt.Sprintf("k%04d", i)), Value: []byte("small value")})
	}
	cfg := Config{ConnsMax: 16, ResponseBytesPerConnMax: 2 * ResponseBytesPerConnMin}
	cfg.ResponseBytesPerTenantMax = cfg.ResponseBytesPerConnMax + 16*responseBytesReserved
	s, addr := start(t, be, cfg)
	c := dialRaw(t, addr)
	c.hello(tokenA)
	other := s.tenants[1]
	const free = 100_000
	held := cfg.ResponseBytesPerTenantMax - responseBytesReserved - free
	other.used.Add(held)
	c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpScan, Tenant: 1, ID: 7, Limit: proto.ScanLimitMax}))
	r := c.mustRecv()
	other.used.Add(-held)
	if r.Status != proto.StatusOK || len(r.Pairs) != proto.ScanLimitMax {
		t.Fatalf("SCAN of %d small pairs beside %d bytes of room: %v, %d pairs %q", proto.ScanLimitMax, free, r.Status, len(r.Pairs), r.Message)
	}
	c.nc.Close()
	eventually(t, "every budget is given back", func() bool { return s.Stats().ResponseBytes == 0 })
}
