package replica

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/internal/stall"
	"synod/kv/proto"
	"synod/paxos"
)

// cpuTime is the process's user plus system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// flightRecorderRound is how many writes one round of
// BenchmarkFlightRecorderCost runs with the recorder in one state.
const flightRecorderRound = 500

// BenchmarkFlightRecorderCost measures what the stall detector's flight
// recorder costs: pipelined writes (16 writers, a 3-replica cluster in
// this process, shm logs) in alternating rounds of flightRecorderRound
// writes with the recorder stopped and running, on the same cluster, so
// that a noisy machine's drift falls on both alike. The threshold is out
// of reach: only the recording is measured, not the snapshots. Reported:
// CPU of the whole process (every replica and the writers) per write and
// wall time per write, for each state, and the CPU overhead in percent.
// docs/benchmarking.md, "Where the tail comes from", reports the figures.
//
//	go test ./kv/replica -run '^$' -bench FlightRecorderCost -benchtime 20000x -count 3
func BenchmarkFlightRecorderCost(b *testing.B) {
	c := newTestClusterWith(b, nil)
	var leader atomic.Uint64
	leader.Store(uint64(c.leader()))
	var retries atomic.Uint64
	put := func(id, seq uint64) {
		req := &proto.Request{Op: proto.OpPut, Tenant: testTenant, ClientID: id, Seq: seq, FirstUnacked: seq,
			Key: []byte(fmt.Sprintf("b%d-%d", id, seq%256)), Value: make([]byte, 128)}
		// A leader change (16 writers on 2 CPUs can starve a heartbeat)
		// is retried with the same sequence: exactly once, and the
		// retry's cost is in the figures.
		for try := 0; try < 100; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp := c.nodes[paxos.NodeID(leader.Load())].be.Do(ctx, testTenant, req)
			cancel()
			if resp.Status == proto.StatusOK {
				return
			}
			retries.Add(1)
			time.Sleep(time.Millisecond)
			for id, n := range c.nodes {
				if n.r.Status().Role == paxos.RoleLeader {
					leader.Store(uint64(id))
				}
			}
		}
		b.Errorf("put %d/%d never succeeded", id, seq)
	}
	const writers = 16
	seqs := make([]uint64, writers)
	// round runs n writes over the writers and returns its CPU and wall
	// time.
	round := func(n int) (cpu, wall time.Duration) {
		var wg sync.WaitGroup
		var left atomic.Int64
		left.Store(int64(n))
		cpu0, t0 := cpuTime(b), time.Now()
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for left.Add(-1) >= 0 {
					seqs[w]++
					put(uint64(2000+w), seqs[w])
				}
			}(w)
		}
		wg.Wait()
		return cpuTime(b) - cpu0, time.Since(t0)
	}
	round(200) // warm up
	var cpu, wall [2]time.Duration
	var n [2]int
	b.ResetTimer()
	for done := 0; done < b.N; {
		for on := 0; on < 2 && done < b.N; on++ {
			k := min(flightRecorderRound, b.N-done)
			var det *stall.Detector
			if on == 1 {
				b.StopTimer()
				var err error
				det, err = stall.New(stall.Config{Recorder: true, Threshold: stall.ThresholdMax}, zerolog.Nop())
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			c, w := round(k)
			cpu[on] += c
			wall[on] += w
			n[on] += k
			done += k
			if det != nil {
				b.StopTimer()
				det.Close()
				b.StartTimer()
			}
		}
	}
	b.StopTimer()
	if n[0] == 0 || n[1] == 0 {
		return // too few writes for both states
	}
	per := func(d time.Duration, n int) float64 { return float64(d.Microseconds()) / float64(n) }
	b.ReportMetric(per(cpu[0], n[0]), "cpu-us/op-off")
	b.ReportMetric(per(cpu[1], n[1]), "cpu-us/op-on")
	b.ReportMetric(per(wall[0], n[0]), "wall-us/op-off")
	b.ReportMetric(per(wall[1], n[1]), "wall-us/op-on")
	b.ReportMetric(100*(per(cpu[1], n[1])/per(cpu[0], n[0])-1), "cpu-overhead-%")
	b.ReportMetric(float64(retries.Load()), "retries")
}
