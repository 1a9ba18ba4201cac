package server

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"synod/kv/proto"
)

// bigPut is a PUT whose body is exactly bodyBytes (a key of
// proto.KeyBytesMax, so that a body of RequestBodyBytesMax is a valid PUT).
func bigPut(id uint64, bodyBytes int) *proto.Request {
	req := &proto.Request{Op: proto.OpPut, Tenant: 1, ID: id, ClientID: 1, Seq: id, FirstUnacked: 1, Key: bytes.Repeat([]byte("k"), proto.KeyBytesMax)}
	over := len(proto.AppendRequest(nil, req)) - proto.HeaderBytes
	req.Value = bytes.Repeat([]byte("v"), bodyBytes-over)
	return req
}

// TestRequestBytesPerConnBackPressure: a connection pipelining large
// writes holds at most its request budget of bodies: past it the next
// frame is not read until an answer gives bytes back, so no write is
// refused and the backend never holds more than fits. Walks the bound:
// two bodies that fill it exactly are read together, one byte more waits.
func TestRequestBytesPerConnBackPressure(t *testing.T) {
	const body = RequestBytesPerConnMin
	for _, tc := range []struct {
		name    string
		connMax int64
		want    int // bodies of size body in flight at once
	}{{"exactly two", 2 * body, 2}, {"one byte short of two", 2*body - 1, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			be := &echoBackend{gate: make(chan struct{})}
			s, addr := start(t, be, Config{RequestBytesPerConnMax: tc.connMax, RequestBytesPerTenantMax: 64 << 20, RequestBytesPerNodeMax: 64 << 20})
			c := dialRaw(t, addr)
			c.hello(tokenA)
			const n = 6
			go func() {
				var frames []byte
				for i := range n {
					frames = proto.AppendRequest(frames, bigPut(uint64(i+1), body))
				}
				c.nc.Write(frames)
			}()
			eventually(t, "requests in flight", func() bool {
				be.mu.Lock()
				defer be.mu.Unlock()
				return be.inflight == tc.want
			})
			time.Sleep(50 * time.Millisecond) // the reader must not take more
			if st := s.Stats(); st.RequestBytes != int64(tc.want)*body {
				t.Fatalf("request bytes held %d, want %d", st.RequestBytes, int64(tc.want)*body)
			}
			close(be.gate)
			for range n {
				if r := c.mustRecv(); r.Status != proto.StatusOK {
					t.Fatalf("a write held back by the request budget: %v %s", r.Status, r.Message)
				}
			}
			if be.peak != tc.want {
				t.Fatalf("the backend held %d writes at once, want %d", be.peak, tc.want)
			}
			eventually(t, "bytes given back", func() bool { return s.Stats().RequestBytes == 0 })
		})
	}
}

// TestRequestBytesPerTenantWaits: a body that does not fit in its
// tenant's request budget waits, unread, while the tenant's other write is
// in flight, and is served (not THROTTLED) once that one is answered
// within requestTenantWaitMax.
func TestRequestBytesPerTenantWaits(t *testing.T) {
	const body = RequestBytesPerConnMin
	be := &echoBackend{gate: make(chan struct{})}
	s, addr := start(t, be, Config{RequestBytesPerConnMax: body, RequestBytesPerTenantMax: body, RequestBytesPerNodeMax: 4 * body})
	first := dialRaw(t, addr)
	first.hello(tokenA)
	first.send(proto.AppendRequest(nil, bigPut(1, body)))
	eventually(t, "the first write held", func() bool { return s.Stats().RequestBytes == body })
	second := dialRaw(t, addr)
	second.hello(tokenA)
	second.send(proto.AppendRequest(nil, bigPut(2, body)))
	time.Sleep(requestTenantWaitMax / 4)
	if st := s.Stats(); st.RequestBytes != body || st.ResponsesThrottled != 0 {
		t.Fatalf("while the tenant's budget is full: %d bytes held (want the first body's %d), %d throttled", st.RequestBytes, int64(body), st.ResponsesThrottled)
	}
	close(be.gate)
	for _, c := range []*rawConn{first, second} {
		if r := c.mustRecv(); r.Status != proto.StatusOK {
			t.Fatalf("write %d: %v %s", r.ID, r.Status, r.Message)
		}
	}
	if st := s.Stats(); st.ResponsesThrottled != 0 {
		t.Fatalf("%d throttled, want none: the second write had only to wait", st.ResponsesThrottled)
	}
}

// TestRequestBytesPerTenantThrottles: a tenant whose connections hold its
// request budget for longer than requestTenantWaitMax gets THROTTLED
// (retry-after set, body skipped, the connection usable) for a body that
// does not fit, while another tenant
// is served; once the bytes come back the tenant is served again.
func TestRequestBytesPerTenantThrottles(t *testing.T) {
	const body = RequestBytesPerConnMin
	be := &echoBackend{gate: make(chan struct{})}
	s, addr := start(t, be, Config{RequestBytesPerConnMax: body, RequestBytesPerTenantMax: body, RequestBytesPerNodeMax: 4 * body})
	first := dialRaw(t, addr)
	first.hello(tokenA)
	first.send(proto.AppendRequest(nil, bigPut(1, body)))
	eventually(t, "the first write held", func() bool { return s.Stats().RequestBytes == body })
	second := dialRaw(t, addr)
	second.hello(tokenA)
	second.send(proto.AppendRequest(nil, bigPut(2, body)))
	r := second.mustRecv()
	if r.Status != proto.StatusThrottled || r.RetryAfter <= 0 || !strings.Contains(r.Message, "request_bytes_per_tenant_max") {
		t.Fatalf("a body past the tenant's request budget: %v retry-after %v %q (want THROTTLED naming request_bytes_per_tenant_max)", r.Status, r.RetryAfter, r.Message)
	}
	// The body was skipped: the connection still speaks frames.
	second.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpPing, Tenant: 1, ID: 3}))
	if r := second.mustRecv(); r.Status != proto.StatusOK || r.ID != 3 {
		t.Fatalf("after the throttled write: %v id %d", r.Status, r.ID)
	}
	// Another tenant is not held back by tenant 1's budget.
	other := dialRaw(t, addr)
	other.hello(tokenB)
	other.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpPing, Tenant: 2, ID: 4}))
	if r := other.mustRecv(); r.Status != proto.StatusOK {
		t.Fatalf("another tenant: %v", r.Status)
	}
	close(be.gate)
	if r := first.mustRecv(); r.Status != proto.StatusOK {
		t.Fatalf("the first write: %v", r.Status)
	}
	eventually(t, "bytes given back", func() bool { return s.Stats().RequestBytes == 0 })
	second.send(proto.AppendRequest(nil, bigPut(5, body)))
	if r := second.mustRecv(); r.Status != proto.StatusOK {
		t.Fatalf("once the budget has room: %v %s", r.Status, r.Message)
	}
	if s.Stats().ResponsesThrottled != 1 {
		t.Fatalf("throttled %d, want 1", s.Stats().ResponsesThrottled)
	}
	// The refusal is tenant 1's, in its own count.
	if a, b := s.TenantBudget(1), s.TenantBudget(2); a.Throttled != 1 || b.Throttled != 0 {
		t.Fatalf("tenant budgets %+v and %+v: want tenant 1's one THROTTLED", a, b)
	}
}

// TestRequestBytesPerNodeThrottles: with the node's request budget held by
// one tenant's write, another tenant's body that does not fit is answered
// THROTTLED (the tenant's own budget has room); a small one still fits.
func TestRequestBytesPerNodeThrottles(t *testing.T) {
	const body = RequestBytesPerConnMin
	be := &echoBackend{gate: make(chan struct{})}
	s, addr := start(t, be, Config{RequestBytesPerConnMax: body, RequestBytesPerTenantMax: body, RequestBytesPerNodeMax: body + 64})
	a := dialRaw(t, addr)
	a.hello(tokenA)
	a.send(proto.AppendRequest(nil, bigPut(1, body)))
	eventually(t, "tenant 1's write held", func() bool { return s.Stats().RequestBytes == body })
	b := dialRaw(t, addr)
	b.hello(tokenB)
	// A PUT of tenant 2 (values of at most 8 bytes) whose body is n bytes.
	smallPut := func(id uint64, n int) *proto.Request {
		req := &proto.Request{Op: proto.OpPut, Tenant: 2, ID: id, ClientID: 1, Seq: id, FirstUnacked: 1, Key: []byte("k"), Value: []byte("v")}
		over := len(proto.AppendRequest(nil, req)) - proto.HeaderBytes - 1
		req.Key = bytes.Repeat([]byte("k"), n-over)
		return req
	}
	req := smallPut(2, 65)
	b.send(proto.AppendRequest(nil, req))
	if r := b.mustRecv(); r.Status != proto.StatusThrottled || r.RetryAfter <= 0 || !strings.Contains(r.Message, "request_bytes_per_node_max") {
		t.Fatalf("a body of 65 bytes with 64 left in the node's budget: %v %q (want THROTTLED naming request_bytes_per_node_max)", r.Status, r.Message)
	}
	b.send(proto.AppendRequest(nil, smallPut(3, 64))) // fits
	close(be.gate)
	if r := b.mustRecv(); r.Status != proto.StatusOK {
		t.Fatalf("a body of 64 bytes with 64 left: %v %s", r.Status, r.Message)
	}
	if r := a.mustRecv(); r.Status != proto.StatusOK {
		t.Fatalf("tenant 1's write: %v", r.Status)
	}
}
