package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"synod/bench/hist"
	"synod/bench/load"
	"synod/kv/client"
	"synod/kv/proto"
)

// Workload limits.
const (
	opTimeout        = 5 * time.Second
	preloadBatchOps  = 128 // proto.BatchOpsMax
	preloadParallel  = 8
	noisyInflightMax = 256
)

// Operation classes.
const (
	classRead      = "read"
	classWrite     = "write"
	classBulkScan  = "bulk-scan"
	classBulkWrite = "bulk-write"
)

// workload holds one client per tenant and draws operations.
type workload struct {
	o       *Options
	clients []*client.Client // [t-1] for tenant t
	bulk    *client.Client   // tenant 1's bulk connection (fails fast when throttled)
	value   []byte
	zipf    *rand.Zipf
	zrng    *rand.Rand
}

func dialTenant(ctx context.Context, eps []string, token string, retries int) (*client.Client, error) {
	return client.Dial(ctx, eps, token, client.Options{RetriesMax: retries, RequestTimeout: opTimeout,
		BackoffBase: time.Millisecond, BackoffMax: 100 * time.Millisecond, DialTimeout: time.Second})
}

func newWorkload(ctx context.Context, o *Options, eps, tokens []string) (*workload, error) {
	w := &workload{o: o, value: make([]byte, o.ValueBytes)}
	for i := range w.value {
		w.value[i] = byte('a' + i%26)
	}
	for t := 0; t < o.Tenants; t++ {
		tok := tokens[min(t, len(tokens)-1)]
		cl, err := dialTenant(ctx, eps, tok, client.RetriesMaxDefault)
		if err != nil {
			w.close()
			return nil, fmt.Errorf("dialing tenant %d: %w", t+1, err)
		}
		w.clients = append(w.clients, cl)
	}
	bulk, err := dialTenant(ctx, eps, tokens[0], 1)
	if err != nil {
		w.close()
		return nil, err
	}
	w.bulk = bulk
	w.zrng = rand.New(rand.NewPCG(o.Seed, 77))
	if o.Dist == "zipf" && o.Keys > 1 {
		w.zipf = rand.NewZipf(w.zrng, o.ZipfS, 1, uint64(o.Keys-1))
	}
	return w, nil
}

func (w *workload) close() {
	for _, c := range w.clients {
		c.Close()
	}
	if w.bulk != nil {
		w.bulk.Close()
	}
}

func keyOf(i int) []byte { return fmt.Appendf(nil, "key-%08d", i) }

func (w *workload) key() []byte {
	if w.zipf != nil {
		return keyOf(int(w.zipf.Uint64()))
	}
	return keyOf(w.zrng.IntN(w.o.Keys))
}

// preloadOpsPer is how many PUTs of valueBytes one preload BATCH carries:
// preloadBatchOps, fewer when their values would pass half a request body
// (a preload of 256 KiB values was refused TOO_LARGE), at least one.
func preloadOpsPer(valueBytes int) int {
	return max(1, min(preloadBatchOps, proto.RequestBodyBytesMax/2/(valueBytes+64)))
}

// preload writes every key of every tenant in batches.
func (w *workload) preload(ctx context.Context) error {
	type job struct{ t, from int }
	per := preloadOpsPer(len(w.value))
	jobs := make(chan job)
	errs := make(chan error, preloadParallel)
	var wg sync.WaitGroup
	for range preloadParallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				var ops []proto.BatchOp
				for k := j.from; k < min(j.from+per, w.o.Keys); k++ {
					ops = append(ops, proto.BatchOp{Op: proto.OpPut, Key: keyOf(k), Value: w.value})
				}
				var err error
				for attempt := 0; attempt < 20; attempt++ {
					c, cancel := context.WithTimeout(ctx, opTimeout)
					if len(ops) == 1 {
						// A value too large to batch with another: a PUT,
						// whose body has room for the largest value.
						err = w.clients[j.t].Put(c, ops[0].Key, ops[0].Value)
					} else {
						err = w.clients[j.t].Batch(c, ops)
					}
					cancel()
					if err == nil {
						break
					}
					time.Sleep(50 * time.Millisecond) // throttled or electing: try again
				}
				if err != nil {
					select {
					case errs <- fmt.Errorf("preloading tenant %d: %w", j.t+1, err):
					default:
					}
				}
			}
		}()
	}
	for t := 0; t < w.o.Tenants; t++ {
		for k := 0; k < w.o.Keys; k += per {
			jobs <- job{t, k}
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// steadyPick draws one steady operation: a uniformly chosen tenant, a
// GET with probability ReadRatio, else a PUT.
func (w *workload) steadyPick(rng *rand.Rand) load.Op {
	t := rng.IntN(w.o.Tenants)
	cl := w.clients[t]
	key := w.key()
	if rng.Float64() < w.o.ReadRatio {
		return load.Op{Class: classRead, Tenant: t + 1, Do: func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, opTimeout)
			defer cancel()
			_, err := cl.Get(ctx, key)
			if err != nil && isNotFound(err) {
				return nil
			}
			return err
		}}
	}
	return load.Op{Class: classWrite, Tenant: t + 1, Do: func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		return cl.Put(ctx, key, w.value)
	}}
}

// noisy runs tenant 1's bulk bursts until stop: every NoisyPeriod,
// NoisyBurst operations at once, alternating full scans and batches of
// BatchOps PUTs. Latency counts from the burst's intended time.
type noisyStats struct {
	scan, write *hist.Hist
	mu          sync.Mutex
	errors      int64
	sent        int64
}

func (w *workload) noisy(stop <-chan struct{}) *noisyStats {
	ns := &noisyStats{scan: hist.New(), write: hist.New()}
	slots := make(chan struct{}, noisyInflightMax)
	var wg sync.WaitGroup
	t := time.NewTicker(w.o.NoisyPeriod)
	defer func() { t.Stop(); wg.Wait() }()
	n := 0
	for {
		var at time.Time
		select {
		case <-stop:
			return ns
		case at = <-t.C:
		}
		for i := 0; i < w.o.NoisyBurst; i++ {
			n++
			scan := n%2 == 0
			select {
			case slots <- struct{}{}:
			default:
				ns.mu.Lock()
				ns.errors++ // the bulk tenant's own backlog is full: counted, not sent
				ns.mu.Unlock()
				continue
			}
			wg.Add(1)
			go func() {
				defer func() { <-slots; wg.Done() }()
				ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
				defer cancel()
				var err error
				h := ns.write
				if scan {
					h = ns.scan
					_, _, err = w.bulk.Scan(ctx, nil, nil, w.o.ScanLimit)
				} else {
					ops := make([]proto.BatchOp, w.o.BatchOps)
					for j := range ops {
						ops[j] = proto.BatchOp{Op: proto.OpPut, Key: keyOf((n*w.o.BatchOps + j) % w.o.Keys), Value: w.value}
					}
					err = w.bulk.Batch(ctx, ops)
				}
				h.Record(time.Since(at))
				ns.mu.Lock()
				ns.sent++
				if err != nil {
					ns.errors++
				}
				ns.mu.Unlock()
			}()
		}
	}
}
