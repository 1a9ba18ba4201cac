package space

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// freeGauge gathers synod_disk_free_bytes from g's collector (ok false
// when the series is absent).
func freeGauge(t *testing.T, g *Guard) (v float64, ok bool) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(g.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "synod_disk_free_bytes" {
			return mf.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestFreeBytesMetric: synod_disk_free_bytes is exported whether the
// reserve is on or off, read by the scrape itself when nothing else read
// it within diskSampleInterval (an outside check: with the reserve off it
// was never read, so never exported), and absent while the reading fails
// (not a stale or zero figure).
func TestFreeBytesMetric(t *testing.T) {
	for _, reserve := range []int64{0, 1 << 20} {
		f := newFixture(t, 0, reserve)
		f.free = 123456789
		if v, ok := freeGauge(t, f.g); !ok || v != 123456789 {
			t.Fatalf("reserve %d: synod_disk_free_bytes %v (present %v), want 123456789", reserve, v, ok)
		}
		reads := f.reads
		f.free = 5
		if v, _ := freeGauge(t, f.g); v != 123456789 || f.reads != reads {
			t.Fatalf("reserve %d: a scrape within %v read again (%d reads, value %v)", reserve, diskSampleInterval, f.reads-reads, v)
		}
		f.now = f.now.Add(diskSampleInterval)
		if v, _ := freeGauge(t, f.g); v != 5 {
			t.Fatalf("reserve %d: after %v the scrape shows %v, want the new reading 5", reserve, diskSampleInterval, v)
		}
		f.g.cfg.FreeBytes = func(string) (int64, error) { return 0, errors.New("planted statfs failure") }
		f.now = f.now.Add(time.Second)
		if v, ok := freeGauge(t, f.g); ok {
			t.Fatalf("reserve %d: with the reading failing the metric says %v, want it absent", reserve, v)
		}
	}
}
