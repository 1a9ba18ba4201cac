package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/proto"
	"synod/tenants"
)

// TestNodeReserveBytes walks the reserve's bounds: a quarter of the node
// or four light holdings, within half the node, and never so much that the
// shared part holds less than one light holding.
func TestNodeReserveBytes(t *testing.T) {
	const mib, l = 1 << 20, tenantLightBytes
	for _, tc := range []struct{ node, want int64 }{
		{96 * mib, 24 * mib},
		{64 * mib, 16 * mib},
		{16 * l, 4 * l},
		{16*l - 4, 4 * l},
		{8 * l, 4 * l},
		{8*l - 2, 4*l - 1},
		{2 * l, l},
		{2*l - 2, l - 2},
		{l + 8<<10, 8 << 10},
		{l, 0},
	} {
		got := nodeReserveBytes(tc.node, l)
		if got != tc.want {
			t.Errorf("node budget %d: reserve %d, want %d", tc.node, got, tc.want)
		}
		if shared := tc.node - got; shared < l {
			t.Errorf("node budget %d: shared part %d holds less than a light tenant's %d", tc.node, shared, l)
		}
		if lo, hi := nodeLimitFor(tc.node, l, true), nodeLimitFor(tc.node, l, false); lo != tc.node || hi != tc.node-got {
			t.Errorf("node budget %d: limit %d for a light tenant and %d for another, want %d and %d", tc.node, lo, hi, tc.node, tc.node-got)
		}
	}
}

// TestNodeReserveOnlyForLightTenants: past the node's shared part a
// charge succeeds for a tenant holding at most tenantLightBytes once
// charged, and for no other.
func TestNodeReserveOnlyForLightTenants(t *testing.T) {
	const mib = 1 << 20
	const node = 64 * mib // reserve 16 MiB, shared 48 MiB
	for _, tc := range []struct {
		name                 string
		tenantUsed, nodeUsed int64
		n                    int64
		want                 budgetFull
	}{
		{"heavy tenant within the shared part", 4 * mib, 46 * mib, mib, budgetNone},
		{"heavy tenant past the shared part", 4 * mib, 47*mib + mib/2, mib, budgetNode},
		{"light tenant past the shared part", 0, 60 * mib, mib, budgetNone},
		{"light tenant to the last byte", tenantLightBytes - mib, node - mib, mib, budgetNone},
		{"one byte past light", tenantLightBytes - mib + 1, 60 * mib, mib, budgetNode},
		{"light tenant, node full", 0, 63*mib + mib/2, mib, budgetNode},
	} {
		c := &conn{queued: newBudget(8 * mib), tbudget: newBudget(8 * mib), s: &Server{node: newBudget(node)}}
		c.tbudget.used.Store(tc.tenantUsed)
		c.s.node.used.Store(tc.nodeUsed)
		got := c.tryChargeOrFull(tc.n)
		if got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
			continue
		}
		charged := int64(0)
		if got == budgetNone {
			charged = tc.n
		}
		if after := [3]int64{c.queued.used.Load(), c.tbudget.used.Load(), c.s.node.used.Load()}; after != [3]int64{charged, tc.tenantUsed + charged, tc.nodeUsed + charged} {
			t.Errorf("%s: budgets hold %v after the charge", tc.name, after)
		}
	}
}

// TestNodeReserveRemembersHeavyTenants: a tenant that held more than the
// light bound stays out of the reserve for tenantHeavyMemory after the
// last moment it did, even holding nothing (a flooder whose connections
// were closed and opened again); then it is light again. A charge that
// was refused (a SCAN's reservation too large for the reserve) does not
// count as holding it.
func TestNodeReserveRemembersHeavyTenants(t *testing.T) {
	const mib = 1 << 20
	clk := &fakeClock{}
	clk.Advance(time.Hour)
	c := &conn{queued: newBudget(8 * mib), tbudget: newBudget(8 * mib), s: &Server{node: newBudget(64 * mib), now: clk.Now}}
	since := func() time.Duration { return clk.Now().Sub(time.Unix(0, 0).Add(time.Hour)) }

	// Refused past the shared part (48 MiB) for its size: not remembered.
	c.s.node.used.Store(60 * mib)
	if got := c.tryChargeOrFull(3 * mib); got != budgetNode {
		t.Fatalf("3 MiB past the shared part: %d", got)
	}
	if got := c.tryChargeOrFull(mib); got != budgetNone {
		t.Fatalf("1 MiB past the shared part after a refused 3 MiB: %d, want charged", got)
	}
	c.uncharge(mib)

	// Heavy within the shared part: 3 MiB charged.
	c.s.node.used.Store(40 * mib)
	if got := c.tryChargeOrFull(3 * mib); got != budgetNone {
		t.Fatalf("3 MiB within the shared part: %d", got)
	}
	c.uncharge(3 * mib) // its answers written: holds nothing
	c.s.node.used.Store(60 * mib)
	for _, step := range []struct {
		advance time.Duration
		want    budgetFull
	}{{0, budgetNode}, {tenantHeavyMemory - time.Nanosecond, budgetNode}, {time.Nanosecond, budgetNone}} {
		clk.Advance(step.advance)
		if got := c.tryChargeOrFull(mib); got != step.want {
			t.Fatalf("holding nothing, %v after it held 3 MiB: %d, want %d", since(), got, step.want)
		}
		if step.want == budgetNone {
			c.uncharge(mib)
		}
	}

	// The memory runs from the last moment it held more: heavy at a
	// charge, then 20 s without one (its charges failing at its own
	// budget), then its answers written: still heavy right after.
	c.s.node.used.Store(40 * mib)
	if got := c.tryChargeOrFull(3 * mib); got != budgetNone {
		t.Fatalf("3 MiB within the shared part: %d", got)
	}
	clk.Advance(2 * tenantHeavyMemory)
	c.uncharge(3 * mib)
	c.s.node.used.Store(60 * mib)
	if got := c.tryChargeOrFull(mib); got != budgetNode {
		t.Fatalf("just after it stopped holding more than the light bound (last charged %v before): %d, want the node refused", 2*tenantHeavyMemory, got)
	}
}

// TestNodeReserveWaiterSeesItsTenantLighten: a request of a heavy tenant
// waiting for room past the node's shared part gets it once its tenant's
// own answers are written and tenantHeavyMemory has passed since, although
// the node stays past its shared part (the limit is asked again at each
// try).
func TestNodeReserveWaiterSeesItsTenantLighten(t *testing.T) {
	const mib = 1 << 20
	clk := &fakeClock{}
	clk.Advance(time.Hour)
	s := &Server{node: newBudget(64 * mib), now: clk.Now} // shared 48 MiB
	tb := newBudget(8 * mib)
	ctx, cancel := context.WithTimeout(context.Background(), pollTimeout)
	defer cancel()
	waiter := &conn{s: s, ctx: ctx, queued: newBudget(8 * mib), tbudget: tb}
	sibling := &conn{s: s, ctx: ctx, queued: newBudget(8 * mib), tbudget: tb}
	sibling.queued.used.Store(3 * mib)
	tb.used.Store(4 * mib)
	s.node.used.Store(63 * mib)
	got := make(chan bool, 1)
	go func() { got <- waiter.charge(responseBytesReserved) }()
	select {
	case ok := <-got:
		t.Fatalf("a heavy tenant's charge past the shared part returned %v without waiting", ok)
	case <-time.After(50 * time.Millisecond):
	}
	sibling.uncharge(3 * mib) // tenant 1 MiB, node 60 MiB: still past its shared part
	select {
	case ok := <-got:
		t.Fatalf("the charge returned %v while its tenant was heavy less than %v ago", ok, tenantHeavyMemory)
	case <-time.After(50 * time.Millisecond):
	}
	clk.Advance(tenantHeavyMemory)
	s.node.release(mib) // another tenant's answer written: node 59 MiB, the waiter tries again
	select {
	case ok := <-got:
		if !ok {
			t.Fatal("the charge failed")
		}
	case <-time.After(pollTimeout):
		t.Fatal("the waiter did not see its tenant become light")
	}
	if n := s.node.used.Load(); n != 59*mib+responseBytesReserved {
		t.Fatalf("node holds %d", n)
	}
}

// TestNodeReserveKeepsRoomForALightTenant: five tenants pipelining GETs
// of the largest value on four connections each and never reading fill
// the node's budget between them (each may hold a quarter of it); a sixth
// tenant's one-at-a-time reader still gets its megabyte values. Without
// the reserve they filled the node and the reader was THROTTLED.
func TestNodeReserveKeepsRoomForALightTenant(t *testing.T) {
	const flooders, connsEach = 5, 4
	reg := numberedTenants(t, flooders+1)
	// The kvnode proportions: a tenant a quarter of the node. At most
	// five flooders and the reader hold a light tenant's share of the
	// reserve each: 6 x 2.1 MiB of 16 MiB.
	cfg := Config{WriteTimeout: 10 * time.Second, ConnsMax: 32, ResponseBytesPerConnMax: 2 * ResponseBytesPerConnMin,
		ResponseBytesPerTenantMax: 16 << 20, ResponseBytesPerNodeMax: 64 << 20}
	s, addr := startWith(t, reg, newBigBackend(0, proto.ValueBytesMax), cfg, zerolog.Nop())
	var conns []*rawConn
	for i := 1; i <= flooders; i++ {
		for j := 0; j < connsEach; j++ {
			c := dialRaw(t, addr)
			c.hello(tenantToken(i))
			pipelineGets(c, tenants.ID(i), 8*proto.InflightPerConnMax)
			conns = append(conns, c)
		}
	}
	// The flood holds the shared part, to within one answer of it (each
	// connection sends 8 pipelines' worth, so THROTTLED GETs keep coming
	// while the reader runs).
	shared := cfg.ResponseBytesPerNodeMax - nodeReserveBytes(cfg.ResponseBytesPerNodeMax, tenantLightBytes)
	eventually(t, "the flooders fill the node's shared part", func() bool {
		return s.Stats().ResponseBytes > shared-getAnswerBytesMax(proto.ValueBytesMax)
	})
	reader := dialRaw(t, addr)
	reader.hello(tenantToken(flooders + 1))
	for i := 0; i < 8; i++ {
		reader.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: flooders + 1, ID: uint64(i + 2), Key: []byte("big")}))
		if r := reader.mustRecv(); r.Status != proto.StatusOK || len(r.Value) != proto.ValueBytesMax {
			t.Fatalf("the light tenant's GET %d beside %d flooding tenants: %v %q", i, flooders, r.Status, r.Message)
		}
	}
	st := s.Stats()
	t.Logf("node holds %d of %d (shared %d), peak %d, throttled %d", st.ResponseBytes, cfg.ResponseBytesPerNodeMax, shared, st.ResponseBytesPeak, st.ResponsesThrottled)
	if st.ResponseBytesPeak > cfg.ResponseBytesPerNodeMax {
		t.Fatalf("the node held %d response bytes, bound %d", st.ResponseBytesPeak, cfg.ResponseBytesPerNodeMax)
	}
	for _, c := range append(conns, reader) {
		c.nc.Close()
	}
	eventually(t, "every budget is given back", func() bool { return s.Stats().ResponseBytes == 0 })
}

// TestNodeReserveLightBounds: a light tenant fits two largest GET answers
// and a reservation, and the least connection budget holds more than a
// light tenant (nodeReserveBytes relies on it).
func TestNodeReserveLightBounds(t *testing.T) {
	if need := 2*getAnswerBytesMax(proto.ValueBytesMax) + responseBytesReserved; tenantLightBytes < need {
		t.Fatalf("tenantLightBytes %d < two largest GET answers and a reservation %d", tenantLightBytes, need)
	}
	if ResponseBytesPerConnMin <= tenantLightBytes {
		t.Fatalf("ResponseBytesPerConnMin %d <= tenantLightBytes %d", ResponseBytesPerConnMin, tenantLightBytes)
	}
}

// TestRequestReserveKeepsRoomForALightTenant: two tenants pipelining
// writes of the largest body on three connections each, whose writes do
// not commit, hold the node's request budget between them (each may hold
// half of it); a third tenant's write of the largest body is still
// admitted. Without the reserve the two filled the node and the write was
// THROTTLED at once.
func TestRequestReserveKeepsRoomForALightTenant(t *testing.T) {
	const body = RequestBytesPerConnMin
	const flooders, connsEach, framesEach = 2, 3, 8
	reg := numberedTenants(t, flooders+1)
	// The kvnode proportions: a tenant half the node's budget.
	cfg := Config{RequestBytesPerConnMax: 2 * body, RequestBytesPerTenantMax: 6 * body, RequestBytesPerNodeMax: 12 * body}
	be := &echoBackend{gate: make(chan struct{})}
	s, addr := startWith(t, reg, be, cfg, zerolog.Nop())
	put := func(tenant tenants.ID, id uint64) []byte {
		req := bigPut(id, body)
		req.Tenant = tenant
		return proto.AppendRequest(nil, req)
	}
	var conns []*rawConn
	for i := 1; i <= flooders; i++ {
		for j := 0; j < connsEach; j++ {
			c := dialRaw(t, addr)
			c.hello(tenantToken(i))
			var frames []byte
			for k := range framesEach {
				frames = append(frames, put(tenants.ID(i), uint64(k+2))...)
			}
			go c.nc.Write(frames) // never read
			conns = append(conns, c)
		}
	}
	// The flood holds at least the shared part and has settled: the
	// node's holding did not change for 200 ms.
	shared := cfg.RequestBytesPerNodeMax - nodeReserveBytes(cfg.RequestBytesPerNodeMax, tenantLightRequestBytes)
	last := int64(-1)
	eventually(t, "the flooders fill the node's shared part", func() bool {
		n := s.Stats().RequestBytes
		settled := n == last && n >= shared
		last = n
		time.Sleep(200 * time.Millisecond)
		return settled
	})
	held, throttled := s.Stats().RequestBytes, s.Stats().ResponsesThrottled
	// Each tenant's share is its own: the flooders' add up to the node's.
	if a, b := s.TenantBudget(1).RequestBytes, s.TenantBudget(2).RequestBytes; a+b != held || a > cfg.RequestBytesPerTenantMax || b > cfg.RequestBytesPerTenantMax {
		t.Fatalf("tenants hold %d and %d request bytes, the node %d", a, b, held)
	}
	w := dialRaw(t, addr)
	w.hello(tenantToken(flooders + 1))
	w.send(put(flooders+1, 2))
	eventually(t, "the light tenant's write admitted", func() bool {
		st := s.Stats()
		if st.ResponsesThrottled > throttled {
			t.Fatalf("the light tenant's write beside %d flooding tenants holding %d of %d request bytes: THROTTLED", flooders, held, cfg.RequestBytesPerNodeMax)
		}
		return st.RequestBytes == held+body
	})
	t.Logf("flood held %d of %d (shared %d), peak %d", held, cfg.RequestBytesPerNodeMax, shared, s.Stats().RequestBytesPeak)
	if p := s.Stats().RequestBytesPeak; p > cfg.RequestBytesPerNodeMax {
		t.Fatalf("the node held %d request bytes, bound %d", p, cfg.RequestBytesPerNodeMax)
	}
	close(be.gate)
	if r := w.mustRecv(); r.Status != proto.StatusOK {
		t.Fatalf("the light tenant's write: %v %s", r.Status, r.Message)
	}
	for _, c := range conns {
		c.nc.Close()
	}
	eventually(t, "every budget is given back", func() bool { return s.Stats().RequestBytes == 0 })
}

// numberedTenants is a registry of tenants 1..n, tenant i's token
// tenantToken(i).
func numberedTenants(t *testing.T, n int) *tenants.Registry {
	t.Helper()
	var specs []tenants.Spec
	for i := 1; i <= n; i++ {
		specs = append(specs, tenants.Spec{ID: tenants.ID(i), Name: fmt.Sprintf("t%d", i), Token: tenantToken(i)})
	}
	reg, err := tenants.NewRegistry(specs)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func tenantToken(i int) string { return fmt.Sprintf("token-tenant-%d", i) }
