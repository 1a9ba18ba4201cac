// Package hist records latencies in HDR histograms (3 significant digits,
// 1 µs to 60 s) and summarises them as the percentiles kvbench reports.
// A Hist is safe for concurrent use.
package hist

import (
	"math"
	"sync"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"
)

// Range and precision of every histogram. Values outside the range are
// clamped to it (and counted in Clamped), never dropped: a latency above
// the top is still a latency above the top.
const (
	LowestMicros     = 1
	HighestMicros    = 60_000_000 // 60 s
	SignificantFigs  = 3
	curvePointsCount = 60
)

// Hist is a concurrent latency histogram in microseconds.
type Hist struct {
	mu      sync.Mutex
	h       *hdr.Histogram
	clamped int64
}

// New returns an empty histogram.
func New() *Hist { return &Hist{h: hdr.New(LowestMicros, HighestMicros, SignificantFigs)} }

// Record adds one latency.
func (x *Hist) Record(d time.Duration) {
	us := d.Microseconds()
	x.mu.Lock()
	if us < LowestMicros {
		us = LowestMicros
	}
	if us > HighestMicros {
		us = HighestMicros
		x.clamped++
	}
	x.h.RecordValue(us)
	x.mu.Unlock()
}

// Merge adds every value of o into x.
func (x *Hist) Merge(o *Hist) {
	o.mu.Lock()
	c := hdr.Import(o.h.Export())
	cl := o.clamped
	o.mu.Unlock()
	x.mu.Lock()
	x.h.Merge(c)
	x.clamped += cl
	x.mu.Unlock()
}

// Count returns the number of recorded values.
func (x *Hist) Count() int64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.h.TotalCount()
}

// Summary is a histogram's figures in microseconds.
type Summary struct {
	Count   int64   `json:"count"`
	MeanUs  float64 `json:"mean_us"`
	P50Us   int64   `json:"p50_us"`
	P90Us   int64   `json:"p90_us"`
	P99Us   int64   `json:"p99_us"`
	P999Us  int64   `json:"p999_us"`
	MaxUs   int64   `json:"max_us"`
	Clamped int64   `json:"clamped,omitempty"`
}

// Summary returns the percentiles. HDR percentiles report the highest
// value equivalent to the bucket holding the rank (within 0.1%).
func (x *Hist) Summary() Summary {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.h.TotalCount() == 0 {
		return Summary{}
	}
	return Summary{Count: x.h.TotalCount(), MeanUs: x.h.Mean(),
		P50Us: x.h.ValueAtQuantile(50), P90Us: x.h.ValueAtQuantile(90), P99Us: x.h.ValueAtQuantile(99),
		P999Us: x.h.ValueAtQuantile(99.9), MaxUs: x.h.Max(), Clamped: x.clamped}
}

// Point is one point of a percentile curve.
type Point struct {
	Percentile float64 `json:"percentile"`
	Us         int64   `json:"us"`
}

// Curve returns the latency at percentiles spaced evenly in "nines"
// (0, 90, 99, 99.9, ... up to 99.999), the shape percentile plots use.
func (x *Hist) Curve() []Point {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.h.TotalCount() == 0 {
		return nil
	}
	out := make([]Point, 0, curvePointsCount+1)
	for i := 0; i <= curvePointsCount; i++ {
		nines := 5 * float64(i) / curvePointsCount // 0 .. 5 nines
		p := 100 * (1 - math.Pow(10, -nines))
		out = append(out, Point{Percentile: p, Us: x.h.ValueAtQuantile(p)})
	}
	return out
}
