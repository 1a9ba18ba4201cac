package replica

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
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

// BenchmarkWritePipelinedSealed measures what a write allocates across the
// whole runtime: 16 writers pipelining 128-byte puts into a 3-replica
// cluster in this process with a cluster secret (every message sealed),
// shm logs. B/op and allocs/op are the three replicas' and the writers'
// together, per write.
//
//	go test ./kv/replica -run '^$' -bench WritePipelinedSealed -benchmem -benchtime 20000x -count 3
func BenchmarkWritePipelinedSealed(b *testing.B) {
	c := newTestClusterWith(b, func(c *testCluster) { c.secret = secretA })
	c.put("warm", "up")
	l := c.leader()
	const writers = 16
	value := make([]byte, 128)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := uint64(5000 + w)
			for seq := uint64(1); next.Add(1) <= int64(b.N); seq++ {
				req := &proto.Request{Op: proto.OpPut, Tenant: testTenant, ClientID: id, Seq: seq, FirstUnacked: seq,
					Key: []byte(fmt.Sprintf("b%d-%d", w, seq%512)), Value: value}
				if resp := c.do(l, req, 10*time.Second); resp.Status != proto.StatusOK {
					b.Errorf("put: %v %s", resp.Status, resp.Message)
					return
				}
			}
		}()
	}
	wg.Wait()
}
