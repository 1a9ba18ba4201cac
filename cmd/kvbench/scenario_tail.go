package main

// The tail scenario: open loop well under capacity. PUTs of --value-bytes
// from the load tenant (uncontracted) arrive as a Poisson process at
// --tail-share (0.5) of the path's measured capacity, latency counted from
// the intended send time; the figures are the write P50, P99 and P99.9
// and the ratios P99/P50 and P99.9/P50. A path whose tail comes from its
// own stalls (snapshots, persists, GC) rather than from queueing shows
// large ratios here, where the load leaves plenty of headroom. Goals
// (issue 14, Paxos paths): P99/P50 <= 5 and P99.9/P50 <= 10.

import (
	"context"
	"math/rand/v2"
	"time"

	"synod/bench/load"
	"synod/kv/client"
)

// TailResult is the tail scenario's figures (the latency summary is the
// phase's Write).
type TailResult struct {
	CapacityOps    float64 `json:"capacity_ops"`
	CapacitySource string  `json:"capacity_source"`
	Share          float64 `json:"share"`
	OfferedOps     float64 `json:"offered_ops"`
	P99OverP50     float64 `json:"p99_over_p50"`
	P999OverP50    float64 `json:"p999_over_p50"`
	// Store is the same writes timed inside the nodes (admission to
	// reply; ClusterWindow.LoadService), with its own ratios: what the
	// store adds, without kvbench's scheduling on the cores it shares
	// with the nodes. The histogram's bounds grow by 1.5x (they doubled
	// before 2026-12-07), so these figures are interpolated within that
	// factor. Nil without the scrapes.
	Store            *StageFigures `json:"store,omitempty"`
	StoreP99OverP50  float64       `json:"store_p99_over_p50,omitempty"`
	StoreP999OverP50 float64       `json:"store_p999_over_p50,omitempty"`
}

// Goals of the tail scenario (reported against, never enforced).
const (
	tailP99RatioGoal  = 5
	tailP999RatioGoal = 10
)

// putsPick returns a pick that sends PUTs of value to uniformly drawn
// keys, round robin over cls, as tenant (the report's tenant index).
func putsPick(cls []*client.Client, keys int, value []byte, class string, tenant int) func(*rand.Rand) load.Op {
	n := 0
	return func(rng *rand.Rand) load.Op {
		cl := cls[n%len(cls)]
		n++
		key := keyOf(rng.IntN(keys))
		return load.Op{Class: class, Tenant: tenant, Do: func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, opTimeout)
			defer cancel()
			return cl.Put(ctx, key, value)
		}}
	}
}

func runTail(ctx context.Context, o *Options, c *cluster, lw *leaderWatch, st *pathRun, warmup time.Duration, bar *progress) (*PhaseResult, error) {
	capOps, src, err := capacityOf(ctx, o, c, st, warmup, scenTail)
	if err != nil {
		return nil, err
	}
	ph := &PhaseResult{Scenario: scenTail}
	rate := o.TailShare * capOps
	cls, err := dialLoadClients(ctx, c, c.tokenFor(loadTenantToken), ceilingClientsMax, client.RetriesMaxDefault)
	if err != nil {
		return nil, err
	}
	defer closeClients(cls)
	value := make([]byte, o.ValueBytes)
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	tw := openWindowAfter(ctx, c, lw, warmup)
	prof := startNodeProfiles(ctx, o, c, scenTail, warmup, o.Duration) // node_profiles.go
	res := load.Run(ctx, load.Config{Rate: rate, Warmup: warmup, Duration: o.Duration, Concurrency: o.Concurrency,
		Seed: o.Seed + 0x7a11, DrainTimeout: 2 * opTimeout, Progress: bar.phase},
		putsPick(cls, o.Keys, value, classWrite, 0))
	tw.finish(ctx, ph)
	ph.NodeProfiles, ph.NodeProfileErrors = prof.wait()
	fillOpenLoop(ph, res, o.Duration)
	ph.Tail = &TailResult{CapacityOps: capOps, CapacitySource: src, Share: o.TailShare, OfferedOps: rate}
	if p50 := ph.Write.P50Us; p50 > 0 {
		ph.Tail.P99OverP50 = float64(ph.Write.P99Us) / float64(p50)
		ph.Tail.P999OverP50 = float64(ph.Write.P999Us) / float64(p50)
	}
	if ph.Cluster != nil {
		ph.Tail.setStore(ph.Cluster.LoadService)
	}
	return ph, nil
}

// setStore records the writes' service time inside the nodes (nil: none
// measured) and its ratios.
func (tl *TailResult) setStore(st *StageFigures) {
	if st == nil || st.Count == 0 {
		return
	}
	tl.Store = st
	if st.P50Ms > 0 {
		tl.StoreP99OverP50, tl.StoreP999OverP50 = st.P99Ms/st.P50Ms, st.P999Ms/st.P50Ms
	}
}

// fillOpenLoop fills a phase's latency, throughput and error figures from
// an open-loop result.
func fillOpenLoop(ph *PhaseResult, res *load.Result, d time.Duration) {
	all := func(load.Key) bool { return true }
	isRead := func(k load.Key) bool { return k.Class == classRead }
	isWrite := func(k load.Key) bool { return k.Class == classWrite }
	rh, wh := res.Merged(isRead), res.Merged(isWrite)
	ph.Read, ph.Write, ph.All = rh.Summary(), wh.Summary(), res.Merged(all).Summary()
	ph.ReadCurve, ph.WriteCurve = rh.Curve(), wh.Curve()
	ph.Offered, ph.Done, ph.Shed = res.Offered, res.Done, res.Shed
	ph.Errors = res.ErrorsOf(all)
	ph.ErrorKinds = res.ErrorKinds
	ok := res.Done - ph.Errors + res.Shed // shed arrivals are counted as errors too
	ph.ThroughputOps = max(float64(ok)/d.Seconds(), 0)
	if ok > 0 && ph.CPUSeconds > 0 {
		ph.CPUPer1000 = ph.CPUSeconds / float64(ok) * 1000
	}
	ph.ScheduleLagMs = float64(res.ScheduleLag.Microseconds()) / 1000
}
