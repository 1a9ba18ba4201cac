package e2e

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// BenchmarkSingleClientLatency measures one client's put and get latency
// (one request in flight) against a 3-node kvnode cluster on loopback.
// Run it with
//
//	go test -run '^$' -bench SingleClientLatency -benchtime 5000x ./e2e/
//
// It prints p50/p99/p99.9, the acceptor log's durability mode and whether
// the leader ran the accel plane (E2E_ACCEL=off|soft sets every node).
func BenchmarkSingleClientLatency(b *testing.B) {
	c := newCluster(b, 3)
	l := c.leader()
	st, _ := c.status(l)
	cl := dialClient(b, c.endpoints(l), tenantA.token, killClientRetries)
	defer cl.Close()
	value := make([]byte, 100)
	for _, op := range []string{"put", "get"} {
		h := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
		ctx, cancel := ctxTimeout(time.Hour)
		// Warm up connections and caches; not measured.
		for i := 0; i < 200; i++ {
			key := []byte(fmt.Sprintf("lat%05d", i%1000))
			if op == "put" {
				cl.Put(ctx, key, value)
			} else {
				cl.Get(ctx, key)
			}
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			key := []byte(fmt.Sprintf("lat%05d", i%1000))
			start := time.Now()
			var err error
			if op == "put" {
				err = cl.Put(ctx, key, value)
			} else {
				_, err = cl.Get(ctx, key)
			}
			if err != nil {
				b.Fatalf("%s %d: %v", op, i, err)
			}
			h.RecordValue(time.Since(start).Microseconds())
		}
		b.StopTimer()
		cancel()
		b.ReportMetric(float64(h.ValueAtQuantile(50)), op+"-p50-us")
		b.ReportMetric(float64(h.ValueAtQuantile(99)), op+"-p99-us")
		fmt.Fprintf(os.Stdout, "latency: op=%s n=%d p50=%dus p99=%dus p999=%dus max=%dus pmem=%s accel(leader)=%s value=%dB nodes=3 transport=udp loopback\n",
			op, b.N, h.ValueAtQuantile(50), h.ValueAtQuantile(99), h.ValueAtQuantile(99.9), h.Max(), st.Durability, nodeAccel(l.id), len(value))
	}
}
