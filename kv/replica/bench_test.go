package replica

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"synod/kv/proto"
)

// BenchmarkWriteInProcess measures one writer's latency through the
// runtime (3 replicas in one process over the in-memory network, PMem
// logs in shm mode), without the client protocol.
func BenchmarkWriteInProcess(b *testing.B) {
	c := newTestCluster(b, 3, 0)
	l := c.leader()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := putReq(fmt.Sprintf("b%d", i%1000), "v")
		start := time.Now()
		if resp := c.do(l, req, 5*time.Second); resp.Status != proto.StatusOK {
			b.Fatalf("put: %v", resp.Status)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	for id, n := range c.nodes {
		m := n.r.metrics
		b.Logf("node %d: leader changes %v, inbound dropped %v, outbound dropped %v, side %v, log full %v",
			id, counterValue(m.LeaderChanges), counterValue(m.InboundDropped), counterValue(m.OutboundDropped), counterValue(m.SideSent), counterValue(m.LogFull))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(lat[len(lat)*90/100].Microseconds()), "p90-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-us")
}
