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

	"synod/kv/local"
	"synod/kv/proto"
	"synod/kv/server"
	"synod/kv/sm"
	"synod/tenants"
)

const token = "client-test-token"

func startServer(t testing.TB, be server.Backend) string {
	t.Helper()
	reg, err := tenants.NewRegistry([]tenants.Spec{{ID: 3, Name: "t", Token: token}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := server.New(server.Config{}, reg, be, zerolog.Nop())
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return ln.Addr().String()
}

func localBackend(t testing.TB) *local.Backend {
	t.Helper()
	s, err := sm.Open(t.TempDir(), sm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return local.New(s, "local")
}

// funcBackend answers with f.
type funcBackend func(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response

func (f funcBackend) Do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
	return f(ctx, tenant, req)
}

// recordSleep replaces the client's sleep: it records each wait and
// returns at once, so that tests do not depend on timing.
type recordSleep struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (r *recordSleep) sleep(ctx context.Context, d time.Duration) error {
	r.mu.Lock()
	r.waits = append(r.waits, d)
	r.mu.Unlock()
	return ctx.Err()
}

func dial(t *testing.T, endpoints []string, opts Options) *Client {
	t.Helper()
	c, err := Dial(context.Background(), endpoints, token, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestBasicOps(t *testing.T) {
	addr := startServer(t, localBackend(t))
	c := dial(t, []string{addr}, Options{})
	ctx := context.Background()
	if c.Tenant() != 3 {
		t.Fatalf("tenant %d", c.Tenant())
	}
	if _, err := c.Get(ctx, []byte("k")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get absent: %v", err)
	}
	if err := c.Put(ctx, []byte("k"), []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, []byte("k")); err != nil || string(v) != "v1" {
		t.Fatalf("get: %q %v", v, err)
	}
	err := c.CAS(ctx, []byte("k"), []byte("nope"), []byte("v2"))
	var se *StatusError
	if !errors.Is(err, ErrCASMismatch) || !errors.As(err, &se) || string(se.Current) != "v1" {
		t.Fatalf("cas mismatch: %v", err)
	}
	if err := c.CAS(ctx, []byte("k"), []byte("v1"), []byte("v2")); err != nil {
		t.Fatal(err)
	}
	err = c.Batch(ctx, []proto.BatchOp{
		{Op: proto.OpPut, Key: []byte("a"), Value: []byte("1")},
		{Op: proto.OpCAS, Key: []byte("k"), ExpectPresent: true, Expect: []byte("v1"), Value: []byte("x")},
	})
	if !errors.As(err, &se) || se.FailedOp != 1 {
		t.Fatalf("batch mismatch: %v", err)
	}
	if err := c.Batch(ctx, []proto.BatchOp{{Op: proto.OpPut, Key: []byte("a"), Value: []byte("1")}, {Op: proto.OpDelete, Key: []byte("k")}}); err != nil {
		t.Fatal(err)
	}
	pairs, more, err := c.Scan(ctx, nil, nil, 10)
	if err != nil || more || len(pairs) != 1 || string(pairs[0].Key) != "a" {
		t.Fatalf("scan: %+v %v %v", pairs, more, err)
	}
	st, err := c.Status(ctx)
	if err != nil || len(st.Members) != 1 || st.Members[0].Applied == 0 {
		t.Fatalf("status: %+v %v", st, err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(ctx, []string{addr}, "not-the-token", Options{}); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("bad token: %v", err)
	}
}

func TestRedirectOnNotLeader(t *testing.T) {
	leader := startServer(t, localBackend(t))
	var followerCalls atomic.Int64
	follower := startServer(t, funcBackend(func(ctx context.Context, _ tenants.ID, req *proto.Request) *proto.Response {
		followerCalls.Add(1)
		return &proto.Response{Status: proto.StatusNotLeader, Leader: leader}
	}))
	var unknownCalls atomic.Int64
	noLeaderKnown := startServer(t, funcBackend(func(ctx context.Context, _ tenants.ID, req *proto.Request) *proto.Response {
		unknownCalls.Add(1)
		return &proto.Response{Status: proto.StatusNotLeader}
	}))
	rs := &recordSleep{}
	c := dial(t, []string{follower, leader}, Options{Sleep: rs.sleep})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		if err := c.Put(ctx, []byte(fmt.Sprint(i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if followerCalls.Load() != 1 {
		t.Fatalf("follower asked %d times; the client should stay with the leader after one redirect", followerCalls.Load())
	}
	if len(rs.waits) != 0 {
		t.Fatalf("a redirect to a named leader waited %v", rs.waits)
	}
	// A node that knows no leader: the client tries the next endpoint.
	c2 := dial(t, []string{noLeaderKnown, leader}, Options{Sleep: rs.sleep})
	if v, err := c2.Get(ctx, []byte("0")); err != nil || string(v) != "v" {
		t.Fatalf("get via next endpoint: %q %v", v, err)
	}
	if unknownCalls.Load() != 1 {
		t.Fatalf("leaderless node asked %d times", unknownCalls.Load())
	}
}

func TestThrottledRetryAfterHonoured(t *testing.T) {
	lb := localBackend(t)
	var calls, retryAfter atomic.Int64
	retryAfter.Store(int64(30 * time.Millisecond))
	addr := startServer(t, funcBackend(func(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
		if calls.Add(1) <= 2 {
			return &proto.Response{Status: proto.StatusThrottled, RetryAfter: time.Duration(retryAfter.Load())}
		}
		return lb.Do(ctx, tenant, req)
	}))
	rs := &recordSleep{}
	c := dial(t, []string{addr}, Options{Sleep: rs.sleep})
	if err := c.Put(context.Background(), []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if len(rs.waits) != 2 {
		t.Fatalf("waited %d times, want 2", len(rs.waits))
	}
	for _, w := range rs.waits {
		if w < 30*time.Millisecond {
			t.Fatalf("waited %v, less than the server's retry-after", w)
		}
	}
	// A retry-after beyond the deadline: fail at once with *ThrottledError.
	// (The deadline leaves the first answer seconds to arrive, so a slow
	// machine does not turn this into a deadline error.)
	calls.Store(-100)
	retryAfter.Store(int64(10 * time.Second))
	rs.waits = nil
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := c.Put(ctx, []byte("k"), []byte("v"))
	var te *ThrottledError
	if !errors.As(err, &te) || te.RetryAfter != 10*time.Second || !errors.Is(err, ErrThrottled) {
		t.Fatalf("throttled past deadline: %v", err)
	}
	if len(rs.waits) != 0 {
		t.Fatalf("waited %v although the deadline comes first", rs.waits)
	}
}

func TestRetriesBounded(t *testing.T) {
	var calls atomic.Int64
	addr := startServer(t, funcBackend(func(ctx context.Context, _ tenants.ID, req *proto.Request) *proto.Response {
		calls.Add(1)
		return &proto.Response{Status: proto.StatusUnavailable}
	}))
	rs := &recordSleep{}
	c := dial(t, []string{addr}, Options{Sleep: rs.sleep, RetriesMax: 4})
	if _, err := c.Get(context.Background(), []byte("k")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("get: %v", err)
	}
	if calls.Load() != 5 {
		t.Fatalf("%d attempts, want 1 + RetriesMax = 5", calls.Load())
	}
}

func TestDeadline(t *testing.T) {
	addr := startServer(t, funcBackend(func(ctx context.Context, _ tenants.ID, req *proto.Request) *proto.Response {
		<-ctx.Done() // never answers in time
		return &proto.Response{Status: proto.StatusUnavailable}
	}))
	c := dial(t, []string{addr}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, []byte("k")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get past deadline: %v", err)
	}
	// The connection is still usable for later calls.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := c.Ping(ctx2); err != nil {
		t.Fatalf("ping after a timed-out call: %v", err)
	}
}

func TestRetriedWriteAppliedOnce(t *testing.T) {
	lb := localBackend(t)
	var mu sync.Mutex
	var ids [][2]uint64
	addr := startServer(t, funcBackend(func(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
		resp := lb.Do(ctx, tenant, req)
		mu.Lock()
		defer mu.Unlock()
		ids = append(ids, [2]uint64{req.ClientID, req.Seq})
		if len(ids) == 1 {
			// The write committed but its answer is lost (leader change).
			return &proto.Response{Status: proto.StatusUnavailable}
		}
		return resp
	}))
	rs := &recordSleep{}
	c := dial(t, []string{addr}, Options{Sleep: rs.sleep})
	// Create-if-absent: applying it twice would answer CAS_MISMATCH.
	if err := c.CAS(context.Background(), []byte("k"), nil, []byte("v")); err != nil {
		t.Fatalf("retried CAS: %v", err)
	}
	if len(ids) != 2 || ids[0] != ids[1] || ids[0][0] != c.ID() {
		t.Fatalf("attempts carried %v; want the same (client, seq) twice", ids)
	}
}

func TestPipelinedOnOneConnection(t *testing.T) {
	addr := startServer(t, localBackend(t))
	c := dial(t, []string{addr}, Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := []byte(fmt.Sprint(i))
			if err := c.Put(context.Background(), k, k); err != nil {
				errs <- err
				return
			}
			if v, err := c.Get(context.Background(), k); err != nil || string(v) != string(k) {
				errs <- fmt.Errorf("get %s: %q %v", k, v, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := c.liveConns(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
}

func TestConnectionFailover(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	addr := startServer(t, localBackend(t))
	rs := &recordSleep{}
	c := dial(t, []string{dead, addr}, Options{Sleep: rs.sleep})
	if err := c.Put(context.Background(), []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(context.Background(), []string{dead}, token, Options{}); !errors.Is(err, ErrConnection) {
		t.Fatalf("dial of a dead endpoint: %v", err)
	}
}
