package server

import (
	"fmt"
	"testing"
	"time"

	"synod/kv/proto"
)

// TestWorkersReusedAndIdleExit: requests one at a time run on one worker;
// 64 held at once need 64 (beside, at most, the workers there before
// them), which all exit once idle for workerIdleMax, and a planted
// goroutine per request (the old way) starts one a request.
func TestWorkersReusedAndIdleExit(t *testing.T) {
	for _, planted := range []bool{false, true} {
		t.Run(fmt.Sprintf("planted=%v", planted), func(t *testing.T) {
			testingNoWorkers = planted
			defer func() { testingNoWorkers = false }()
			be := &echoBackend{}
			s, addr := start(t, be, Config{})
			c := dialRaw(t, addr)
			c.hello(tokenA)
			const n = 200
			for i := 0; i < n; i++ {
				c.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(i + 1), Key: []byte("k")}))
				if r := c.mustRecv(); r.Status != proto.StatusOK || r.ID != uint64(i+1) {
					t.Fatalf("request %d: %v id %d", i, r.Status, r.ID)
				}
			}
			started := s.workersStarted.Load()
			fmt.Printf("workers: planted=%v sequential_requests=%d workers_started=%d\n", planted, n, started)
			if !planted && started > 3 {
				t.Fatalf("%d requests one at a time started %d workers", n, started)
			}
			if planted && started != n {
				t.Fatalf("planted: %d workers started for %d requests", started, n)
			}
			if planted {
				return
			}

			// 64 at once: each on its own worker, all in flight together.
			// A worker still on its way back from the last request (or
			// idle) may miss a hand-off, so the burst starts a new one
			// and that worker stays, idle: up to the workers there before
			// the burst may be there beside the 64 (CI saw 65).
			before := s.workers.Load()
			be.mu.Lock()
			be.gate = make(chan struct{})
			gate := be.gate
			be.mu.Unlock()
			var frames []byte
			for i := 0; i < 64; i++ {
				frames = proto.AppendRequest(frames, &proto.Request{Op: proto.OpGet, Tenant: 1, ID: uint64(1000 + i), Key: []byte("k")})
			}
			c.send(frames)
			for deadline := time.Now().Add(10 * time.Second); ; {
				be.mu.Lock()
				in := be.inflight
				be.mu.Unlock()
				if in == 64 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of 64 requests in flight", in)
				}
				time.Sleep(time.Millisecond)
			}
			if w := s.workers.Load(); w < 64 || w > 64+before {
				t.Fatalf("%d workers for 64 requests in flight (%d before them), want 64 to %d", w, before, 64+before)
			}
			close(gate)
			for i := 0; i < 64; i++ {
				c.mustRecv()
			}
			// Idle workers exit after workerIdleMax.
			for deadline := time.Now().Add(workerIdleMax + 5*time.Second); s.workers.Load() > 0; {
				if time.Now().After(deadline) {
					t.Fatalf("%d workers still there %v after the last request", s.workers.Load(), workerIdleMax+5*time.Second)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
