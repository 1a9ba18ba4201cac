package tenants

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestLatencyBucketsFine: the per-tenant latency histogram's bounds start
// at 10 µs and grow by 1.5x to about 1.3 s, so a quantile read from them
// is within a factor of 1.5 (the comment's contract); an observation
// lands in the bucket its value names.
func TestLatencyBucketsFine(t *testing.T) {
	reg, err := NewRegistry([]Spec{{ID: 1, Name: "alpha", Token: "alpha-token-0001"}})
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(reg)
	m.ObserveService(1, 3*time.Millisecond)
	pr := prometheus.NewRegistry()
	pr.MustRegister(m)
	mfs, err := pr.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var bounds []float64
	var counts []uint64
	for _, mf := range mfs {
		if mf.GetName() != "synod_tenant_latency_seconds" {
			continue
		}
		for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
			counts = append(counts, b.GetCumulativeCount())
		}
	}
	if len(bounds) != latencyBucketsCount {
		t.Fatalf("%d buckets, want %d", len(bounds), latencyBucketsCount)
	}
	if bounds[0] != 10e-6 || bounds[len(bounds)-1] < 1.2 || bounds[len(bounds)-1] > 1.4 {
		t.Fatalf("bounds %v .. %v, want 10 µs .. about 1.3 s", bounds[0], bounds[len(bounds)-1])
	}
	for i := 1; i < len(bounds); i++ {
		if r := bounds[i] / bounds[i-1]; math.Abs(r-1.5) > 1e-9 {
			t.Fatalf("bound %d is %.4fx the one before, want 1.5x", i, r)
		}
	}
	// 3 ms lies in (bounds[k-1], bounds[k]]: counted from bucket k on.
	for i, b := range bounds {
		want := uint64(0)
		if b >= 0.003 {
			want = 1
		}
		if counts[i] != want {
			t.Fatalf("bucket le=%v holds %d of a 3 ms observation, want %d", b, counts[i], want)
		}
	}
}
