package hist

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// within checks got against want with HDR's 3-significant-digit error
// plus one microsecond of rounding.
func within(t *testing.T, name string, got, want int64) {
	t.Helper()
	tol := float64(want)/1000*2 + 1
	if math.Abs(float64(got-want)) > tol {
		t.Errorf("%s = %d µs, want %d ± %.0f", name, got, want, tol)
	}
}

// TestUniformPercentiles: 1..100000 µs once each; the p-th percentile is
// p% of the range.
func TestUniformPercentiles(t *testing.T) {
	h := New()
	for v := 1; v <= 100000; v++ {
		h.Record(time.Duration(v) * time.Microsecond)
	}
	s := h.Summary()
	if s.Count != 100000 {
		t.Fatalf("count %d", s.Count)
	}
	within(t, "p50", s.P50Us, 50000)
	within(t, "p90", s.P90Us, 90000)
	within(t, "p99", s.P99Us, 99000)
	within(t, "p99.9", s.P999Us, 99900)
	within(t, "max", s.MaxUs, 100000)
	if math.Abs(s.MeanUs-50000.5) > 50 {
		t.Errorf("mean %.1f", s.MeanUs)
	}
}

// TestExponentialPercentiles: samples of an exponential distribution with
// mean 1 ms; quantile q is -ln(1-q) ms. Compared with the exact order
// statistics of the same sample, so only the histogram's error counts.
func TestExponentialPercentiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h := New()
	const n = 200000
	vals := make([]int64, n)
	for i := range vals {
		v := int64(rng.ExpFloat64() * 1000)
		if v < 1 {
			v = 1
		}
		vals[i] = v
		h.Record(time.Duration(v) * time.Microsecond)
	}
	sort.Slice(vals, func(i, j int) bool { return vals[i] < vals[j] })
	exact := func(q float64) int64 { return vals[int(math.Ceil(q*n))-1] }
	s := h.Summary()
	within(t, "p50", s.P50Us, exact(0.5))
	within(t, "p99", s.P99Us, exact(0.99))
	within(t, "p99.9", s.P999Us, exact(0.999))
	// And the distribution itself: p99 of Exp(1 ms) is ln(100) ms.
	if math.Abs(float64(s.P99Us)-1000*math.Log(100)) > 150 {
		t.Errorf("p99 %d µs far from ln(100) ms", s.P99Us)
	}
}

// TestBimodalTail: 99% fast at 100 µs, 1% slow at 50 ms — the P99 sits on
// the fast mode's edge and P99.9 must show the slow mode in full.
func TestBimodalTail(t *testing.T) {
	h := New()
	for i := 0; i < 99000; i++ {
		h.Record(100 * time.Microsecond)
	}
	for i := 0; i < 1000; i++ {
		h.Record(50 * time.Millisecond)
	}
	s := h.Summary()
	within(t, "p50", s.P50Us, 100)
	within(t, "p99", s.P99Us, 100)
	within(t, "p99.9", s.P999Us, 50000)
	within(t, "max", s.MaxUs, 50000)
}

func TestClampAndMerge(t *testing.T) {
	a, b := New(), New()
	a.Record(2 * time.Minute) // above the top: clamped, still counted
	b.Record(0)
	a.Merge(b)
	s := a.Summary()
	if s.Count != 2 || s.Clamped != 1 || s.MaxUs < HighestMicros*999/1000 {
		t.Fatalf("%+v", s)
	}
	if len(a.Curve()) == 0 || New().Summary().Count != 0 {
		t.Fatal("curve or empty summary")
	}
}
