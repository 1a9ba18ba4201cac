// Package load is kvbench's open-loop load generator.
//
// Arrivals follow a Poisson process at a set rate: the gaps between
// intended send times are exponential, drawn from a seeded generator, and
// the schedule is fixed in advance of the responses. An operation's
// latency is measured from its INTENDED send time, not from when a worker
// got round to it, so a stalled server cannot hide its stall by slowing
// the offered load (the "coordinated omission" of closed-loop tools): if
// the server stops for a second, every arrival of that second waits and
// every one of them is recorded with its full wait.
//
// Concurrency bounds the operations in flight; arrivals beyond it queue
// (their queueing counts in their latency). PendingMax bounds the queue:
// arrivals past it are not sent and are counted as Shed, with latency
// recorded as the time from intent to the end of the run, so shedding
// never flatters the tail.
package load

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"synod/bench/hist"
)

// Limits.
const (
	// PendingMaxDefault bounds arrivals waiting for a concurrency slot.
	PendingMaxDefault = 100_000
	// ConcurrencyDefault bounds operations in flight.
	ConcurrencyDefault = 512
	// drainTimeoutDefault bounds the wait for in-flight operations after
	// the last arrival.
	drainTimeoutDefault = 10 * time.Second
	// errorKindBytes and errorKindsMax bound the error breakdown.
	errorKindBytes = 80
	errorKindsMax  = 32
)

// Op is one operation chosen for an arrival.
type Op struct {
	// Class names what it is ("read", "write", "bulk-scan", ...).
	Class string
	// Tenant is the tenant it runs as (index into the caller's tenants).
	Tenant int
	// Do runs the operation.
	Do func(ctx context.Context) error
}

// Config is one run's schedule.
type Config struct {
	Rate         float64       // arrivals per second (> 0)
	Warmup       time.Duration // arrivals in this first part are run but not recorded
	Duration     time.Duration // recorded part, after Warmup
	Concurrency  int           // operations in flight; 0: ConcurrencyDefault
	PendingMax   int           // queued arrivals; 0: PendingMaxDefault
	Seed         uint64
	DrainTimeout time.Duration // 0: 10 s
	// Progress, when set, is called from the schedule goroutine about
	// every 100 ms with the fraction of the schedule done.
	Progress func(frac float64)

	// fromSend measures latency from the actual send, as a closed-loop
	// tool does: the planted bug the tests show the checks catch.
	fromSend bool
}

// Key identifies one histogram of a result.
type Key struct {
	Class  string
	Tenant int
}

// Result holds one run's figures.
type Result struct {
	Hists  map[Key]*hist.Hist
	Errors map[Key]int64
	// ErrorKinds counts errors by message (the first errorKindBytes of
	// it), so a report can say what failed.
	ErrorKinds map[string]int64
	Offered    int64 // arrivals in the recorded window
	Done       int64 // recorded arrivals that completed (ok or error)
	Shed       int64 // recorded arrivals never sent (queue full)
	// Elapsed is the recorded window as scheduled (Duration).
	Elapsed time.Duration
	// ScheduleLag is how far behind its schedule the generator itself
	// fell at worst (a loaded client machine): above a few ms the offered
	// rate was not met and the run says so.
	ScheduleLag time.Duration

	mu sync.Mutex
}

func (r *Result) hist(k Key) *hist.Hist {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.Hists[k]
	if h == nil {
		h = hist.New()
		r.Hists[k] = h
	}
	return h
}

func (r *Result) addErr(k Key, err error) {
	msg := "shed: never sent"
	if err != nil {
		msg = err.Error()
	}
	if len(msg) > errorKindBytes {
		msg = msg[:errorKindBytes]
	}
	r.mu.Lock()
	r.Errors[k]++
	if _, ok := r.ErrorKinds[msg]; ok || len(r.ErrorKinds) < errorKindsMax {
		r.ErrorKinds[msg]++
	}
	r.mu.Unlock()
}

// Merged returns one histogram of every key accepted by keep.
func (r *Result) Merged(keep func(Key) bool) *hist.Hist {
	out := hist.New()
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, h := range r.Hists {
		if keep(k) {
			out.Merge(h)
		}
	}
	return out
}

// ErrorsOf sums the errors of keys accepted by keep.
func (r *Result) ErrorsOf(keep func(Key) bool) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for k, e := range r.Errors {
		if keep(k) {
			n += e
		}
	}
	return n
}

// Run drives pick's operations on the Poisson schedule of cfg until the
// schedule ends or ctx is cancelled, then waits for in-flight operations
// (up to the drain timeout). pick is called from one goroutine with the
// run's generator.
func Run(ctx context.Context, cfg Config, pick func(rng *rand.Rand) Op) *Result {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = ConcurrencyDefault
	}
	if cfg.PendingMax <= 0 {
		cfg.PendingMax = PendingMaxDefault
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = drainTimeoutDefault
	}
	res := &Result{Hists: map[Key]*hist.Hist{}, Errors: map[Key]int64{}, ErrorKinds: map[string]int64{}, Elapsed: cfg.Duration}
	if cfg.Rate <= 0 || cfg.Duration <= 0 {
		return res
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6b76626e63))
	opCtx, cancelOps := context.WithCancel(context.Background())
	defer cancelOps()
	slots := make(chan struct{}, cfg.Concurrency)
	var (
		wg      sync.WaitGroup
		pending atomic.Int64
	)
	start := time.Now()
	measureFrom := start.Add(cfg.Warmup)
	end := measureFrom.Add(cfg.Duration)
	total := cfg.Warmup + cfg.Duration
	nextProgress := start
	intended := start
	for {
		intended = intended.Add(time.Duration(rng.ExpFloat64() / cfg.Rate * float64(time.Second)))
		if !intended.Before(end) {
			break
		}
		// Wait for the intended time; when behind, do not wait (the
		// schedule is absolute, so a late generator catches up instead
		// of lowering the rate).
		if d := time.Until(intended); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		} else if lag := -d; lag > res.ScheduleLag {
			res.ScheduleLag = lag
		}
		if ctx.Err() != nil {
			break
		}
		if cfg.Progress != nil && time.Now().After(nextProgress) {
			cfg.Progress(float64(time.Since(start)) / float64(total))
			nextProgress = time.Now().Add(100 * time.Millisecond)
		}
		op := pick(rng)
		recorded := !intended.Before(measureFrom)
		key := Key{Class: op.Class, Tenant: op.Tenant}
		if recorded {
			res.Offered++
		}
		if pending.Load() >= int64(cfg.PendingMax) {
			if recorded {
				atomic.AddInt64(&res.Shed, 1)
				res.hist(key).Record(end.Sub(intended))
				res.addErr(key, nil)
			}
			continue
		}
		pending.Add(1)
		wg.Add(1)
		go func(at time.Time) {
			defer wg.Done()
			select {
			case slots <- struct{}{}:
			case <-opCtx.Done():
				// Never sent before the drain deadline: shed, with its
				// full wait recorded.
				pending.Add(-1)
				if recorded {
					res.hist(key).Record(time.Since(at))
					res.addErr(key, nil)
					atomic.AddInt64(&res.Shed, 1)
				}
				return
			}
			pending.Add(-1)
			if cfg.fromSend {
				at = time.Now()
			}
			err := op.Do(opCtx)
			<-slots
			lat := time.Since(at)
			if !recorded {
				return
			}
			res.hist(key).Record(lat)
			if err != nil {
				res.addErr(key, err)
			}
			atomic.AddInt64(&res.Done, 1)
		}(intended)
	}
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(cfg.DrainTimeout):
		cancelOps()
		<-drained
	}
	if cfg.Progress != nil {
		cfg.Progress(1)
	}
	return res
}
