package load

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// slowServer serves one request at a time, each taking service.
type slowServer struct {
	mu      sync.Mutex
	service time.Duration
	served  int
}

func (s *slowServer) do(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	time.Sleep(s.service)
	s.served++
	return nil
}

func pickFor(do func(context.Context) error) func(*rand.Rand) Op {
	return func(rng *rand.Rand) Op {
		class := "read"
		if rng.IntN(10) < 3 {
			class = "write"
		}
		return Op{Class: class, Tenant: rng.IntN(4), Do: do}
	}
}

// TestOpenLoopAgainstSlowServer: a server far slower than the offered
// rate must neither lower the number of arrivals (the schedule depends
// only on the seed) nor hide its queueing: latencies count from the
// intended send time, so the tail must show the whole backlog.
func TestOpenLoopAgainstSlowServer(t *testing.T) {
	cfg := Config{Rate: 200, Duration: time.Second, Concurrency: 64, Seed: 9, DrainTimeout: time.Minute}
	fast := Run(context.Background(), cfg, pickFor(func(context.Context) error { return nil }))
	srv := &slowServer{service: 20 * time.Millisecond}
	slow := Run(context.Background(), cfg, pickFor(srv.do))

	if slow.Offered != fast.Offered {
		t.Fatalf("offered %d arrivals against the slow server, %d against the fast one: the schedule was not open-loop", slow.Offered, fast.Offered)
	}
	if slow.Offered < 120 || slow.Offered > 280 {
		t.Fatalf("offered %d arrivals, want about 200 (Poisson, 1 s at 200/s)", slow.Offered)
	}
	if slow.Done != slow.Offered || slow.Shed != 0 {
		t.Fatalf("done %d shed %d of %d", slow.Done, slow.Shed, slow.Offered)
	}
	if n := slow.Merged(func(Key) bool { return true }).Count(); n != slow.Offered {
		t.Fatalf("recorded %d latencies for %d arrivals", n, slow.Offered)
	}
	if err := backlogShown(slow, srv.service, cfg.Duration); err != nil {
		t.Fatal(err)
	}
	all := slow.Merged(func(Key) bool { return true }).Summary()
	fastAll := fast.Merged(func(Key) bool { return true }).Summary()
	if fastAll.P99Us >= all.P99Us {
		t.Fatalf("fast p99 %d µs not below slow p99 %d µs", fastAll.P99Us, all.P99Us)
	}
}

// TestShedIsRecorded: with a tiny queue, arrivals past it are shed and
// still appear in the tail.
func TestShedIsRecorded(t *testing.T) {
	block := make(chan struct{})
	cfg := Config{Rate: 2000, Duration: 200 * time.Millisecond, Concurrency: 1, PendingMax: 5, Seed: 3, DrainTimeout: 100 * time.Millisecond}
	done := make(chan *Result)
	go func() {
		done <- Run(context.Background(), cfg, pickFor(func(ctx context.Context) error {
			select {
			case <-block:
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}))
	}()
	r := <-done
	close(block)
	if r.Shed == 0 {
		t.Fatal("nothing shed with a queue of 5 and a stalled server")
	}
	all := r.Merged(func(Key) bool { return true })
	if all.Count() != r.Offered {
		t.Fatalf("recorded %d of %d offered", all.Count(), r.Offered)
	}
	if e := r.ErrorsOf(func(Key) bool { return true }); e < r.Shed {
		t.Fatalf("errors %d < shed %d", e, r.Shed)
	}
}

func TestWarmupNotRecorded(t *testing.T) {
	cfg := Config{Rate: 1000, Warmup: 200 * time.Millisecond, Duration: 200 * time.Millisecond, Seed: 5}
	var mu sync.Mutex
	calls := 0
	r := Run(context.Background(), cfg, pickFor(func(context.Context) error { mu.Lock(); calls++; mu.Unlock(); return nil }))
	if int64(calls) <= r.Offered || r.Offered == 0 {
		t.Fatalf("calls %d, recorded %d: warm-up arrivals should run unrecorded", calls, r.Offered)
	}
}

// backlogShown checks the tail of a run against a server that serves one
// request per service: the last of N requests completes no sooner than
// N*service after the first arrival, and every arrival came within the
// window, so the worst latency is at least N*service - window. A
// closed-loop tool would report about Concurrency*service at most.
func backlogShown(r *Result, service, window time.Duration) error {
	all := r.Merged(func(Key) bool { return true }).Summary()
	floor := time.Duration(r.Offered)*service - window
	if got := time.Duration(all.MaxUs) * time.Microsecond; got < floor*99/100 {
		return fmt.Errorf("max latency %v below the physical floor %v: queueing time was hidden", got, floor)
	}
	if got := time.Duration(all.P99Us) * time.Microsecond; got < floor/2 {
		return fmt.Errorf("p99 %v hides the backlog (floor of the max %v)", got, floor)
	}
	return nil
}

// TestCheckCatchesClosedLoopMeasurement plants the closed-loop bug
// (latency from the actual send) and shows backlogShown rejects it.
func TestCheckCatchesClosedLoopMeasurement(t *testing.T) {
	cfg := Config{Rate: 200, Duration: time.Second, Concurrency: 4, Seed: 9, DrainTimeout: time.Minute, fromSend: true}
	srv := &slowServer{service: 20 * time.Millisecond}
	r := Run(context.Background(), cfg, pickFor(srv.do))
	if err := backlogShown(r, srv.service, cfg.Duration); err == nil {
		t.Fatal("latency measured from the actual send passed the backlog check")
	}
}
