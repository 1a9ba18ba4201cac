package replica

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/pmem"
)

// BenchmarkWriteInProcessMsync is BenchmarkWriteInProcess with the
// acceptor logs as msync'ed files (pmem mode msync, under the test's temp
// dir) instead of /dev/shm: the mode in which the leader's own persist
// used to be a second msync in a row on every write's critical path
// (persister.go). Compare the two for the ratio docs/benchmarking.md
// reports.
func BenchmarkWriteInProcessMsync(b *testing.B) {
	c := newTestClusterWith(b, func(c *testCluster) { c.pmemDir = b.TempDir() })
	if m := c.pmemMode(); m != pmem.ModeMsync {
		b.Fatalf("pmem mode %v, want msync", m)
	}
	l := c.leader()
	changesAtStart := leaderChanges(c)
	lat := make([]time.Duration, 0, b.N)
	failed := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := putReq(fmt.Sprintf("b%d", i%1000), "v")
		start := time.Now()
		for try := 0; ; try++ {
			resp := c.do(l, req, 5*time.Second)
			if resp.Status == proto.StatusOK {
				break
			}
			// A leader change (the failure this benchmark watches for):
			// counted, and the write retried on the new leader.
			failed++
			if try == 10 {
				b.Fatalf("put: %v", resp.Status)
			}
			l = c.leader()
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	b.ReportMetric(float64(failed), "failed-puts")
	changes := leaderChanges(c) - changesAtStart
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lat[len(lat)*90/100].Microseconds()), "p90-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-us")
	b.ReportMetric(changes, "leader-changes")
}

// leaderChanges sums the nodes' leader-change counters.
func leaderChanges(c *testCluster) float64 {
	n := 0.0
	for _, nd := range c.nodes {
		n += counterValue(nd.r.metrics.LeaderChanges)
	}
	return n
}
