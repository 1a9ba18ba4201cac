package tenants_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"synod/accel"
	"synod/tenants"
)

// BenchmarkNoisyNeighbor measures, in one run and on the wall clock, the
// victim tenant's P99 latency (arrival to end of service: queueing plus
// service) with and without a noisy neighbor, for three front ends:
//
//	off   - no shaping, one shared bounded FIFO in front of the proposer
//	soft  - tenants.Shaper + tenants.DRR
//	accel - the accel plane's shaper table (Plane.Admit) + tenants.DRR
//
// and reports the interference ratio victim P99 noisy / quiet for each.
// Both tenants contract benchVictimRate ops/s; the noisy one offers ten
// times that, which together exceeds the proposer's capacity
// (1/benchService). Arrivals are open loop: each op is stamped with its
// scheduled time, so a stalled generator cannot hide queueing.
//
//	go test ./tenants -run XXX -bench NoisyNeighbor -benchtime 1x
func BenchmarkNoisyNeighbor(b *testing.B) {
	for range b.N {
		var lines []string
		for _, mode := range []string{"off", "soft", "accel"} {
			quiet := runInterference(b, mode, false)
			noisy := runInterference(b, mode, true)
			ratio := float64(noisy) / float64(max(quiet, 1))
			b.ReportMetric(float64(quiet.Microseconds()), mode+"-quiet-p99-µs")
			b.ReportMetric(float64(noisy.Microseconds()), mode+"-noisy-p99-µs")
			b.ReportMetric(ratio, mode+"-interference")
			lines = append(lines, fmt.Sprintf("tenants: shaper=%s victim_p99_quiet=%v victim_p99_noisy=%v interference=%.2fx",
				mode, quiet.Round(time.Microsecond), noisy.Round(time.Microsecond), ratio))
		}
		for _, l := range lines {
			fmt.Println(l)
		}
	}
}

const (
	benchVictimRate = 500                    // ops/s, both contracts
	benchService    = 200 * time.Microsecond // proposer time per op: capacity 5,000 ops/s
	benchDuration   = 2 * time.Second
	benchFrameBytes = 100
)

type benchItem struct {
	tenant  tenants.ID
	arrival time.Time
}

// runInterference runs one configuration and returns the victim's P99.
func runInterference(b *testing.B, mode string, noise bool) time.Duration {
	reg, err := tenants.NewRegistry([]tenants.Spec{
		{ID: 1, Name: "noisy", Token: "noisy-token", OpsPerSec: benchVictimRate, OpsBurst: 10},
		{ID: 2, Name: "victim", Token: "victim-token", OpsPerSec: benchVictimRate, OpsBurst: 10},
	})
	if err != nil {
		b.Fatal(err)
	}
	epoch := time.Now()
	var admit func(id tenants.ID) bool
	switch mode {
	case "soft":
		s := tenants.NewShaper(reg, time.Now, nil)
		admit = func(id tenants.ID) bool { ok, _ := s.Admit(id, 0, benchFrameBytes); return ok }
	case "accel":
		spec := accel.DefaultSpec()
		p, err := accel.New(spec, accel.WithClock(func() uint64 { return uint64(time.Since(epoch) / accel.TickDuration) }))
		if err != nil {
			b.Fatal(err)
		}
		for _, sp := range reg.All() {
			p.SetTenant(nil, int(sp.ID), uint64(sp.OpsPerSec), uint64(sp.OpsBurst), 0, 0)
		}
		admit = func(id tenants.ID) bool { ok, _ := p.Admit(int(id), benchFrameBytes); return ok }
	default:
		admit = func(tenants.ID) bool { return true }
	}

	var mu sync.Mutex
	var fifo []benchItem
	drr := tenants.NewDRR[benchItem](reg, tenants.DRRConfig{}, time.Now, nil)
	wake := make(chan struct{}, 1) // the proposer sleeps on it when idle
	enqueue := func(it benchItem) {
		if !admit(it.tenant) {
			return
		}
		defer func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		}()
		if mode == "off" {
			mu.Lock()
			if len(fifo) < tenants.TenantQueueItemsMax {
				fifo = append(fifo, it)
			}
			mu.Unlock()
			return
		}
		_ = drr.Enqueue(it.tenant, benchFrameBytes, it) // a full queue is a THROTTLED
	}
	dequeue := func() (benchItem, bool) {
		if mode == "off" {
			mu.Lock()
			defer mu.Unlock()
			if len(fifo) == 0 {
				return benchItem{}, false
			}
			it := fifo[0]
			fifo = fifo[1:]
			return it, true
		}
		it, _, ok := drr.Dequeue()
		return it, ok
	}

	ctx, cancel := context.WithTimeout(context.Background(), benchDuration)
	defer cancel()
	var wg sync.WaitGroup
	gen := func(id tenants.ID, every time.Duration) {
		defer wg.Done()
		next := time.Now()
		for ctx.Err() == nil {
			for now := time.Now(); !next.After(now); next = next.Add(every) {
				enqueue(benchItem{tenant: id, arrival: next})
			}
			time.Sleep(time.Until(next))
		}
	}
	wg.Add(1)
	go gen(2, time.Second/benchVictimRate)
	if noise {
		wg.Add(1)
		go gen(1, time.Second/(10*benchVictimRate))
	}
	var lat []time.Duration
	for ctx.Err() == nil {
		it, ok := dequeue()
		if !ok {
			select {
			case <-wake:
			case <-ctx.Done():
			}
			continue
		}
		for start := time.Now(); time.Since(start) < benchService; {
		}
		if it.tenant == 2 {
			lat = append(lat, time.Since(it.arrival))
		}
	}
	wg.Wait()
	if len(lat) == 0 {
		b.Fatalf("%s noise=%v: no victim ops served", mode, noise)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[min(len(lat)-1, len(lat)*99/100)]
}
