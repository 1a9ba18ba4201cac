package tenants

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type fakeClock struct{ t time.Time }

func newFakeClock() *fakeClock               { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }
func (c *fakeClock) Now() time.Time          { return c.t }
func (c *fakeClock) Advance(d time.Duration) { c.t = c.t.Add(d) }

func testRegistry(t testing.TB, specs ...Spec) *Registry {
	t.Helper()
	for i := range specs {
		if specs[i].Token == "" {
			specs[i].Token = "token-for-" + specs[i].Name
		}
	}
	r, err := NewRegistry(specs)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestBucketEdges(t *testing.T) {
	var b Bucket
	b.SetRate(10, 5, 0) // 10/s, burst 5
	for i := 0; i < 5; i++ {
		if ok, _ := AdmitPair(&b, &Bucket{}, 0, 0); !ok {
			t.Fatalf("burst item %d refused", i)
		}
	}
	ok, wait := AdmitPair(&b, &Bucket{}, 0, 0)
	if ok || wait != 100_000 { // one token at 10/s: 100 ms
		t.Fatalf("empty bucket: ok=%v wait=%dµs, want refused with 100000", ok, wait)
	}
	if ok, _ := AdmitPair(&b, &Bucket{}, 0, 99_999); ok {
		t.Fatal("admitted 1µs early")
	}
	if ok, _ := AdmitPair(&b, &Bucket{}, 0, 100_000); !ok {
		t.Fatal("refused at the retry-after time")
	}
	// Refill never exceeds the burst, and time going backwards is ignored.
	b.Refill(1 << 40)
	if b.Tokens != b.Burst {
		t.Fatalf("tokens %d above/below burst %d after a long idle", b.Tokens, b.Burst)
	}
	b.Refill(5)
	if b.Last != 1<<40 {
		t.Fatal("refill went back in time")
	}
	// A frame bigger than the burst passes once the bucket is full.
	var by Bucket
	by.SetRate(1000, 100, 0)
	if ok, _ := AdmitPair(&Bucket{}, &by, 5000, 0); !ok {
		t.Fatal("oversized frame refused on a full bucket")
	}
	if ok, w := AdmitPair(&Bucket{}, &by, 5000, 0); ok || w != 100_000 {
		t.Fatalf("oversized frame on an empty bucket: ok=%v wait=%d", ok, w)
	}
	// Zero rate: unlimited.
	var u Bucket
	u.SetRate(0, 0, 0)
	for i := 0; i < 1000; i++ {
		if ok, _ := AdmitPair(&u, &u, 1<<30, 0); !ok {
			t.Fatal("unlimited bucket refused")
		}
	}
}

func TestShaperRetryAfter(t *testing.T) {
	clk := newFakeClock()
	reg := testRegistry(t, Spec{ID: 1, Name: "a", OpsPerSec: 100, OpsBurst: 2, BytesPerSec: 1000, BytesBurst: 1000})
	m := NewMetrics(reg)
	s := NewShaper(reg, clk.Now, m)
	for i := 0; i < 2; i++ {
		if ok, _ := s.Admit(1, 0, 10); !ok {
			t.Fatalf("frame %d refused", i)
		}
	}
	ok, ra := s.Admit(1, 0, 10)
	if ok || ra != 10*time.Millisecond {
		t.Fatalf("third frame: ok=%v retryAfter=%v, want refused, 10ms", ok, ra)
	}
	clk.Advance(ra)
	if ok, _ := s.Admit(1, 0, 10); !ok {
		t.Fatal("refused after waiting retryAfter")
	}
	// Bytes bound: 970 bytes left after 3x10; a 2000-byte frame costs the
	// whole 1000-byte burst and must wait for 30 bytes at 1000 B/s.
	clk.Advance(time.Second)
	s.Admit(1, 0, 500)
	if ok, ra := s.Admit(1, 0, 2000); ok || ra != 500*time.Millisecond {
		t.Fatalf("bytes-bound frame: ok=%v retryAfter=%v, want 500ms", ok, ra)
	}
	if ok, ra := s.Admit(99, 0, 1); ok || ra != 0 {
		t.Fatalf("unknown tenant: %v %v", ok, ra)
	}
	r := prometheus.NewRegistry()
	r.MustRegister(m)
	if got := metricValue(t, r, "synod_tenant_ops_total", "a", ""); got != 4 {
		t.Fatalf("ops metric %v, want 4", got)
	}
	if got := metricValue(t, r, "synod_tenant_throttled_total", "a", "rate"); got != 2 {
		t.Fatalf("throttled metric %v, want 2", got)
	}
}

// metricValue gathers r and returns the counter for tenant (and reason).
func metricValue(t *testing.T, r *prometheus.Registry, name, tenant, reason string) float64 {
	t.Helper()
	fams, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if (l.GetName() == "tenant" && l.GetValue() != tenant) || (l.GetName() == "reason" && l.GetValue() != reason) {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

func TestDRRBoundsAndPriority(t *testing.T) {
	clk := newFakeClock()
	reg := testRegistry(t,
		Spec{ID: 1, Name: "bulk", Priority: ClassBulk},
		Spec{ID: 2, Name: "std", Priority: ClassStandard},
		Spec{ID: 3, Name: "crit", Priority: ClassCritical},
	)
	d := NewDRR[int](reg, DRRConfig{QueueItemsMax: 4}, clk.Now, nil)
	for i := 0; i < 4; i++ {
		if err := d.Enqueue(1, 100, i); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Enqueue(1, 100, 4); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("fifth item: %v, want ErrQueueFull", err)
	}
	if err := d.Enqueue(9, 1, 0); !errors.Is(err, ErrUnknownTenant) {
		t.Fatalf("unknown tenant: %v", err)
	}
	d.Enqueue(2, 100, 20)
	d.Enqueue(3, 100, 30)
	var order []ID
	for {
		_, id, ok := d.Dequeue()
		if !ok {
			break
		}
		order = append(order, id)
	}
	if got := order; len(got) != 6 || got[0] != 3 || got[1] != 2 || got[2] != 1 {
		t.Fatalf("order %v, want critical, standard, then bulk", got)
	}
	if d.Len() != 0 {
		t.Fatal("not empty")
	}
}

func TestDRRWeightsShareBytes(t *testing.T) {
	clk := newFakeClock()
	reg := testRegistry(t, Spec{ID: 1, Name: "small", Weight: 1}, Spec{ID: 2, Name: "big", Weight: 3})
	d := NewDRR[int](reg, DRRConfig{QueueItemsMax: 1000, QuantumBytes: 1000}, clk.Now, nil)
	for i := 0; i < 1000; i++ {
		d.Enqueue(1, 500, i)
		d.Enqueue(2, 500, i)
	}
	served := map[ID]int{}
	for i := 0; i < 800; i++ {
		_, id, _ := d.Dequeue()
		served[id]++
	}
	if r := float64(served[2]) / float64(served[1]); r < 2.9 || r > 3.1 {
		t.Fatalf("served %v, want a 1:3 split", served)
	}
}

func TestRegistryRejectsBadWeightAndClass(t *testing.T) {
	for _, s := range []Spec{{ID: 1, Name: "w", Token: "tttttttt", Weight: -1}, {ID: 1, Name: "c", Token: "tttttttt", Priority: 7}} {
		if _, err := NewRegistry([]Spec{s}); err == nil || !strings.Contains(err.Error(), "tenants:") {
			t.Fatalf("accepted %+v", s)
		}
	}
}

// TestFrameBytesMaxMatchesBucket checks Spec.FrameBytesMax against the
// bucket the shaper builds: a frame of that size is admitted by a full
// bucket, and the bucket's capacity is exactly that many bytes.
func TestFrameBytesMaxMatchesBucket(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want int64
	}{
		{Spec{}, 0},
		{Spec{BytesBurst: 500}, 0}, // no rate: unlimited
		{Spec{BytesPerSec: 1000, BytesBurst: 4096}, 4096},
		{Spec{BytesPerSec: 1000}, 1000},                          // burst 0: one second's worth
		{Spec{BytesPerSec: 999.5}, 1000},                         // rounded up, as the bucket does
		{Spec{BytesPerSec: 10, BytesBurst: 1e15}, RatePerSecMax}, // the shaper clamps a burst as it clamps a rate
	} {
		if got := tc.spec.FrameBytesMax(); got != tc.want {
			t.Errorf("%+v: FrameBytesMax %d, want %d", tc.spec, got, tc.want)
		}
		if tc.want == 0 {
			continue
		}
		var b Bucket
		b.SetRate(ratePerSec(tc.spec.BytesPerSec), ratePerSec(tc.spec.BytesBurst), 0)
		if b.Burst != uint64(tc.want)*MicroTokensPerToken {
			t.Errorf("%+v: bucket capacity %d micro-tokens, want %d bytes", tc.spec, b.Burst, tc.want)
		}
	}
}

// TestDRRBoundsBytes: a tenant's queue holds at most QueueBytesMax frame
// bytes, byte by byte at the bound; an empty queue takes one item of any
// size (the largest write always passes); dequeuing gives the bytes back;
// another tenant's queue is not touched by the full one.
func TestDRRBoundsBytes(t *testing.T) {
	clk := newFakeClock()
	reg := testRegistry(t, Spec{ID: 1, Name: "big"}, Spec{ID: 2, Name: "other"})
	const bound = 1000
	d := NewDRR[int](reg, DRRConfig{QueueBytesMax: bound}, clk.Now, nil)
	if err := d.Enqueue(1, 600, 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Enqueue(1, bound-600+1, 1); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("one byte past the bound: %v, want ErrQueueFull", err)
	}
	if err := d.Enqueue(1, bound-600, 1); err != nil {
		t.Fatalf("exactly at the bound: %v", err)
	}
	if err := d.Enqueue(1, 0, 2); err != nil {
		t.Fatalf("an empty frame at the bound: %v", err)
	}
	if err := d.Enqueue(1, 1, 3); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("one byte more at the bound: %v, want ErrQueueFull", err)
	}
	if err := d.Enqueue(2, 3*bound, 20); err != nil {
		t.Fatalf("another tenant's empty queue takes an item past the bound: %v", err)
	}
	if err := d.Enqueue(2, 1, 21); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("behind an item past the bound: %v, want ErrQueueFull", err)
	}
	for {
		v, id, ok := d.Dequeue()
		if !ok {
			break
		}
		if id == 1 && v == 0 {
			// 600 bytes given back: 600 fit again, 601 do not.
			if err := d.Enqueue(1, 601, 4); !errors.Is(err, ErrQueueFull) {
				t.Fatalf("601 bytes after 600 were dequeued: %v, want ErrQueueFull", err)
			}
			if err := d.Enqueue(1, 600, 4); err != nil {
				t.Fatalf("600 bytes after 600 were dequeued: %v", err)
			}
		}
	}
	if err := d.Enqueue(1, bound, 5); err != nil {
		t.Fatalf("a drained queue: %v", err)
	}
}
