package replica

import (
	"flag"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/paxos"
)

var (
	accelBenchWrites = flag.Int("accel.writes", 2000, "BenchmarkAccelCommitLatency: victim writes per phase")
	accelBenchNoise  = flag.Int("accel.noise", 8, "BenchmarkAccelCommitLatency: noisy closed-loop writers")
	accelBenchRounds = flag.Int("accel.rounds", 2, "BenchmarkAccelCommitLatency: rounds (each runs accel off then soft)")
)

type latencyFigures struct{ p50, p99 time.Duration }

func percentiles(lat []time.Duration) latencyFigures {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return latencyFigures{p50: lat[len(lat)/2], p99: lat[len(lat)*99/100]}
}

// BenchmarkAccelCommitLatency measures one writer's write latency (propose
// -> commit -> apply -> answer, without the client protocol) on a 3-node
// in-process cluster (in-memory network, PMem logs in shm mode where
// /dev/shm exists), accel off and soft on every node, in the same run and
// interleaved: first quiet, then beside noisy closed-loop writers (the
// interference ratio is victim P99 noisy / quiet; no tenant shaper, one
// FIFO proposer queue). Run with -benchtime 1x.
func BenchmarkAccelCommitLatency(b *testing.B) {
	type result struct {
		quiet, noisy []time.Duration
		fast, early  uint64
		mode         string
	}
	res := map[bool]*result{false: {}, true: {}}
	for round := 0; round < *accelBenchRounds; round++ {
		for _, soft := range []bool{false, true} {
			on := map[paxos.NodeID]bool{}
			if soft {
				on = map[paxos.NodeID]bool{1: true, 2: true, 3: true}
			}
			c := newTestClusterWith(b, func(tc *testCluster) { tc.accelOn = on })
			r := res[soft]
			l := c.leader()
			r.mode = c.nodes[l].r.Mode()
			victim := func(n int) []time.Duration {
				lat := make([]time.Duration, 0, n)
				for i := 0; i < n; i++ {
					req := putReq(fmt.Sprintf("v%d", i%1000), "v")
					start := time.Now()
					for tries := 0; c.do(l, req, 5*time.Second).Status != proto.StatusOK; tries++ {
						// A leader change under noise: the retry's wait counts.
						if tries == 100 {
							b.Fatal("victim put never succeeded")
						}
						time.Sleep(time.Millisecond)
						l = c.leader()
					}
					lat = append(lat, time.Since(start))
				}
				return lat
			}
			victim(200) // warm up
			r.quiet = append(r.quiet, victim(*accelBenchWrites)...)
			var stop atomic.Bool
			var wg sync.WaitGroup
			for w := 0; w < *accelBenchNoise; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for seq := uint64(1); !stop.Load(); seq++ {
						req := &proto.Request{Op: proto.OpPut, Tenant: testTenant, ClientID: 5000 + uint64(w), Seq: seq,
							FirstUnacked: seq, Key: []byte(fmt.Sprintf("n%d-%d", w, seq%1000)), Value: make([]byte, 256)}
						c.do(l, req, 5*time.Second)
					}
				}(w)
			}
			time.Sleep(50 * time.Millisecond)
			r.noisy = append(r.noisy, victim(*accelBenchWrites)...)
			stop.Store(true)
			wg.Wait()
			if st, ok := c.nodes[l].r.AccelStats(); ok {
				r.early += st.EarlyApplied
			}
			for _, n := range c.nodes {
				if st, ok := n.r.AccelStats(); ok {
					r.fast += st.FastAccepts
				}
			}
			for id := range c.nodes {
				c.stop(id)
			}
		}
	}
	for _, soft := range []bool{false, true} {
		r := res[soft]
		name := "off"
		if soft {
			name = "soft"
		}
		q, n := percentiles(r.quiet), percentiles(r.noisy)
		fmt.Printf("accel: commit latency accel=%s durability=%s p50=%v p99=%v (noisy p50=%v p99=%v) writes=%d fast_accepts=%d early_applied=%d\n",
			name, r.mode, q.p50, q.p99, n.p50, n.p99, len(r.quiet), r.fast, r.early)
		fmt.Printf("accel: interference accel=%s victim_p99_quiet=%v victim_p99_noisy=%v ratio=%.2fx\n",
			name, q.p99, n.p99, float64(n.p99)/float64(q.p99))
		b.ReportMetric(float64(q.p50.Microseconds()), name+"-p50-us")
		b.ReportMetric(float64(q.p99.Microseconds()), name+"-p99-us")
	}
}
