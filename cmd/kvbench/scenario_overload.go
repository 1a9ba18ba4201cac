package main

// The overload scenario: offered load above capacity must be shed by
// priority, never collapse the cluster. With the path's capacity measured
// (the ceiling phase, or a closed loop now), two victim tenants, one
// critical and one standard, each offer --victim-rate ops/s (open loop,
// --read-ratio GETs, else PUTs of --value-bytes) first alone (quiet), then
// beside a bulk flood tenant that offers --overload-factor (1.5) times the
// capacity in PUTs, open loop. Every tenant here is uncontracted, so what
// sheds is the node's overload guard (kv/replica/overload.go: bulk first),
// not a tenant's token bucket. Reported: throughput of all tenants under
// the flood as a share of capacity (goal >= 90 %), THROTTLED by priority
// (the nodes' synod_overload_shed_total, and what the clients saw), and
// each victim's P99 under the flood against its quiet P99 (goal within
// 2x). Leader changes are counted over the flood's window (goal 0).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"synod/bench/hist"
	"synod/bench/load"
	"synod/kv/client"
)

// Shape of the overload scenario.
const (
	// floodClients spread the flood over this many client objects.
	floodClients = 8
	// floodRetries: a flood request throttled once is retried once after
	// the server's retry-after, then counted as THROTTLED (a client that
	// retried for ever would turn the open loop into a closed one).
	floodRetries = 1
	// victimKeys is each victim's key space (written before the quiet
	// run, so its GETs find values); victimSetupPause is the pause before
	// a failed setup put is tried again.
	victimKeys       = 100
	victimSetupPause = 50 * time.Millisecond
	// Goals (reported against, never enforced).
	overloadShareGoal       = 0.9
	overloadVictimRatioGoal = 2.0
)

// Report tenant indices of the overload scenario's load.Run keys.
const (
	overloadTenantFlood  = 1
	overloadTenantCrit   = 2
	overloadTenantStd    = 3
	overloadFloodClass   = "flood"
	overloadTenantsCount = 3
)

// OverloadResult is the overload scenario's figures.
type OverloadResult struct {
	CapacityOps     float64 `json:"capacity_ops"`
	CapacitySource  string  `json:"capacity_source"`
	Factor          float64 `json:"factor"`
	FloodOfferedOps float64 `json:"flood_offered_ops"`
	VictimRateOps   float64 `json:"victim_rate_ops"` // each victim
	// ThroughputOps: successful operations per second of every tenant
	// under the flood; ShareOfCapacity is it over CapacityOps.
	ThroughputOps   float64 `json:"throughput_ops"`
	ShareOfCapacity float64 `json:"share_of_capacity"`
	FloodOK         int64   `json:"flood_ok"`
	FloodShed       int64   `json:"flood_generator_shed"` // never sent: the generator's own queue was full
	// ShedByClass: THROTTLED by the nodes' overload guard, per priority
	// class, summed over the nodes (nil: the path has no overload guard,
	// as the raft path).
	ShedByClass map[string]int64 `json:"shed_by_class,omitempty"`
	// ThrottledByTenant: requests that ended THROTTLED at the client
	// (after its retries), by tenant: flood, victim-critical,
	// victim-standard.
	ThrottledByTenant map[string]int64 `json:"throttled_by_tenant"`
	Victims           []VictimFigures  `json:"victims"`
	// VictimsIn says where the victims' load ran: victimsOwnProcess (a
	// child: victims_process.go) or victimsInline (kvbench's process,
	// beside the flood's generator). VictimLagMs is how far behind its
	// schedule the victims' generator fell at worst, quiet or flooded.
	VictimsIn   string  `json:"victims_in"`
	VictimLagMs float64 `json:"victim_lag_ms"`
}

// Where the overload scenario's victims ran (OverloadResult.VictimsIn).
const (
	victimsOwnProcess = "own process"
	victimsInline     = "kvbench's process"
)

// startOverloadVictims readies the victims' load where o says: in a child
// process (the default) or here. run runs it once, adding the requests
// that ended THROTTLED to thr; progress (may be nil) follows its schedule.
func startOverloadVictims(ctx context.Context, o *Options, c *cluster, cfg load.Config, value []byte) (
	run func(name string, thr *throttleCounts, progress func(float64)) (*load.Result, error), closeAll func(), err error) {
	critTok, stdTok := c.tokenFor(victimCritTenantTok), c.tokenFor(victimStdTenantTok)
	if !o.VictimsInline {
		p, err := startVictims(victimSpec{Endpoints: c.endpoints, CritToken: critTok, StdToken: stdTok, Rate: cfg.Rate,
			ReadRatio: o.ReadRatio, ValueBytes: len(value), Warmup: cfg.Warmup, Duration: cfg.Duration,
			Concurrency: cfg.Concurrency, Seed: cfg.Seed})
		if err != nil {
			return nil, nil, err
		}
		run = func(name string, thr *throttleCounts, progress func(float64)) (*load.Result, error) {
			res, got, err := p.run(ctx, name, progress)
			if err != nil {
				return nil, err
			}
			for i := range got {
				thr[i].Add(got[i].Load())
			}
			return res, nil
		}
		return run, p.close, nil
	}
	crit, err := dialTenant(ctx, c.endpoints, critTok, client.RetriesMaxDefault)
	if err != nil {
		return nil, nil, fmt.Errorf("dialing the critical victim: %w", err)
	}
	std, err := dialTenant(ctx, c.endpoints, stdTok, client.RetriesMaxDefault)
	if err != nil {
		crit.Close()
		return nil, nil, fmt.Errorf("dialing the standard victim: %w", err)
	}
	closeAll = func() { crit.Close(); std.Close() }
	for _, cl := range []*client.Client{crit, std} {
		if err := writeVictimKeys(ctx, cl, value); err != nil {
			closeAll()
			return nil, nil, err
		}
	}
	run = func(_ string, thr *throttleCounts, progress func(float64)) (*load.Result, error) {
		cfg := cfg
		cfg.Progress = progress
		return load.Run(ctx, cfg, thr.counted(victimPick(o, crit, std, value))), nil
	}
	return run, closeAll, nil
}

// VictimFigures is one victim tenant's quiet and flooded figures.
type VictimFigures struct {
	Tenant   string       `json:"tenant"`
	Priority string       `json:"priority"`
	Quiet    hist.Summary `json:"quiet"`
	Flood    hist.Summary `json:"flood"`
	// Ratio is Flood.P99Us over Quiet.P99Us.
	Ratio float64 `json:"p99_ratio"`
	// Store is the same tenant's requests timed inside the nodes (the
	// tenant's service time, admission to reply:
	// synod_tenant_latency_seconds{stage="service"}, summed over the
	// nodes): what the store adds, without any client's own
	// scheduling on a machine it shares with the nodes. Nil when a node
	// did not answer a scrape.
	Store        *StoreVictimFigures `json:"store,omitempty"`
	QuietErrors  int64               `json:"quiet_errors"`
	FloodErrors  int64               `json:"flood_errors"`
	FloodOKOps   float64             `json:"flood_ok_ops"`
	QuietOKOps   float64             `json:"quiet_ok_ops"`
	QuietOffered int64               `json:"quiet_offered"`
}

// StoreVictimFigures is a victim tenant's service time inside the nodes,
// quiet and under the flood (bucket-interpolated, as PromQL's
// histogram_quantile).
type StoreVictimFigures struct {
	QuietCount   int64   `json:"quiet_count"`
	QuietP50Ms   float64 `json:"quiet_p50_ms"`
	QuietP99Ms   float64 `json:"quiet_p99_ms"`
	FloodCount   int64   `json:"flood_count"`
	FloodP50Ms   float64 `json:"flood_p50_ms"`
	FloodP99Ms   float64 `json:"flood_p99_ms"`
	Ratio        float64 `json:"p99_ratio"`
	OverTopBound bool    `json:"over_top_bound,omitempty"`
}

// tenantServiceMetric is the per-tenant latency histogram the nodes export.
const tenantServiceMetric = "synod_tenant_latency_seconds"

// storeVictim computes tenant's store-side figures from the scrapes
// before the quiet run (s0), between the runs (s1) and after the flood
// (s2); nil if any node is missing from any of them.
func storeVictim(tenant string, s0, s1, s2 []metrics) *StoreVictimFigures {
	qf, ok1 := tenantService(tenant, s0, s1)
	ff, ok2 := tenantService(tenant, s1, s2)
	if !ok1 || !ok2 {
		return nil
	}
	sv := &StoreVictimFigures{QuietCount: qf.Count, QuietP50Ms: qf.P50Ms, QuietP99Ms: qf.P99Ms,
		FloodCount: ff.Count, FloodP50Ms: ff.P50Ms, FloodP99Ms: ff.P99Ms, OverTopBound: qf.Over || ff.Over}
	if sv.QuietP99Ms > 0 {
		sv.Ratio = sv.FloodP99Ms / sv.QuietP99Ms
	}
	return sv
}

// tenantService is tenant's service time inside the nodes (admission to
// reply) between the scrapes a and b, summed over the nodes; false if a
// node is missing from either scrape or the tenant has no series.
func tenantService(tenant string, a, b []metrics) (StageFigures, bool) {
	var acc []bucket
	want := map[string]string{"tenant": tenant, "stage": "service"}
	for k := range b {
		if k >= len(a) || a[k] == nil || b[k] == nil {
			return StageFigures{}, false
		}
		acc = deltaBuckets(acc, labeledBuckets(a[k], tenantServiceMetric, want), labeledBuckets(b[k], tenantServiceMetric, want))
	}
	if len(acc) == 0 {
		return StageFigures{}, false
	}
	return figuresOf("service", acc), true
}

// throttleCounts counts requests that ended THROTTLED, per report tenant.
type throttleCounts [overloadTenantsCount + 1]atomic.Int64

// counted wraps a pick so that THROTTLED outcomes are counted.
func (t *throttleCounts) counted(pick func(*rand.Rand) load.Op) func(*rand.Rand) load.Op {
	return func(rng *rand.Rand) load.Op {
		op := pick(rng)
		do := op.Do
		op.Do = func(ctx context.Context) error {
			err := do(ctx)
			if errors.Is(err, client.ErrThrottled) && op.Tenant >= 0 && op.Tenant < len(t) {
				t[op.Tenant].Add(1)
			}
			return err
		}
		return op
	}
}

// victimPick draws a victim operation: a victim chosen uniformly, a GET
// with probability ReadRatio, else a PUT.
func victimPick(o *Options, crit, std *client.Client, value []byte) func(*rand.Rand) load.Op {
	return func(rng *rand.Rand) load.Op {
		tenant, cl := overloadTenantCrit, crit
		if rng.IntN(2) == 1 {
			tenant, cl = overloadTenantStd, std
		}
		key := fmt.Appendf(nil, "victim-%04d", rng.IntN(victimKeys))
		if rng.Float64() < o.ReadRatio {
			return load.Op{Class: classRead, Tenant: tenant, Do: func(ctx context.Context) error {
				ctx, cancel := context.WithTimeout(ctx, opTimeout)
				defer cancel()
				_, err := cl.Get(ctx, key)
				if err != nil && isNotFound(err) {
					return nil
				}
				return err
			}}
		}
		return load.Op{Class: classWrite, Tenant: tenant, Do: func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, opTimeout)
			defer cancel()
			return cl.Put(ctx, key, value)
		}}
	}
}

func runOverload(ctx context.Context, o *Options, c *cluster, lw *leaderWatch, st *pathRun, warmup time.Duration, bar *progress) (*PhaseResult, error) {
	capOps, src, err := capacityOf(ctx, o, c, st, warmup, scenOverload)
	if err != nil {
		return nil, err
	}
	value := victimValue(o.ValueBytes)
	victimCfg := load.Config{Rate: 2 * o.VictimRate, Warmup: warmup, Duration: o.Duration, Concurrency: o.Concurrency,
		Seed: o.Seed + 0x51c7, DrainTimeout: 2 * opTimeout}
	runVictims, closeVictims, err := startOverloadVictims(ctx, o, c, victimCfg, value)
	if err != nil {
		return nil, err
	}
	defer closeVictims()
	flood, err := dialLoadClients(ctx, c, c.tokenFor(floodTenantToken), floodClients, floodRetries)
	if err != nil {
		return nil, err
	}
	defer closeClients(flood)

	// Quiet: the victims alone.
	scrape0 := c.scrapeAll(ctx)
	var quietThrottled throttleCounts
	quiet, err := runVictims("quiet", &quietThrottled, func(f float64) { bar.phase(min(f/2, 0.499)) })
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	scrape1 := c.scrapeAll(ctx)
	// The flood beside the same victims' load (same schedule seed).
	ph := &PhaseResult{Scenario: scenOverload}
	floodRate := o.OverloadFactor * capOps
	var thr throttleCounts
	tw := openWindowAfter(ctx, c, lw, warmup)
	prof := startNodeProfiles(ctx, o, c, scenOverload, warmup, o.Duration) // node_profiles.go
	var (
		victims   *load.Result
		victimErr error
		wg        sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		victims, victimErr = runVictims("flood", &thr, nil)
	}()
	floodRes := load.Run(ctx, load.Config{Rate: floodRate, Warmup: warmup, Duration: o.Duration, Concurrency: o.Concurrency,
		Seed: o.Seed + 0xf100d, DrainTimeout: 2 * opTimeout, Progress: func(f float64) { bar.phase(0.5 + f/2) }},
		thr.counted(putsPick(flood, o.Keys, value, overloadFloodClass, overloadTenantFlood)))
	wg.Wait()
	scrape2 := c.scrapeAll(ctx)
	tw.finish(ctx, ph)
	ph.NodeProfiles, ph.NodeProfileErrors = prof.wait()
	if victimErr != nil {
		return nil, victimErr
	}

	// The phase's own figures are the victims' under the flood.
	fillOpenLoop(ph, victims, o.Duration)
	ph.Victim = ph.All
	okOf := func(r *load.Result, keep func(load.Key) bool) int64 {
		var done int64
		for k, h := range r.Hists {
			if keep(k) {
				done += h.Count()
			}
		}
		// Every recorded arrival is in a histogram, shed ones too;
		// errors (shed included) are not successes.
		return done - r.ErrorsOf(keep)
	}
	all := func(load.Key) bool { return true }
	floodOK := okOf(floodRes, all)
	victimsOK := okOf(victims, all)
	or := &OverloadResult{CapacityOps: capOps, CapacitySource: src, Factor: o.OverloadFactor, FloodOfferedOps: floodRate,
		VictimRateOps: o.VictimRate, FloodOK: floodOK, FloodShed: floodRes.Shed,
		ThroughputOps: float64(floodOK+victimsOK) / o.Duration.Seconds()}
	or.ShareOfCapacity = or.ThroughputOps / capOps
	or.VictimsIn = victimsOwnProcess
	if o.VictimsInline {
		or.VictimsIn = victimsInline
	}
	or.VictimLagMs = float64(max(quiet.ScheduleLag, victims.ScheduleLag).Microseconds()) / 1000
	if ph.Cluster != nil {
		or.ShedByClass = ph.Cluster.ShedByClass
	}
	or.ThrottledByTenant = map[string]int64{
		"flood": thr[overloadTenantFlood].Load(), "victim-critical": thr[overloadTenantCrit].Load(), "victim-standard": thr[overloadTenantStd].Load(),
	}
	for _, v := range []struct {
		idx        int
		name, prio string
		node       string // the tenant's name in the nodes' config
	}{{overloadTenantCrit, "victim-critical", "critical", "kvbench-victim-critical"}, {overloadTenantStd, "victim-standard", "standard", "kvbench-victim-standard"}} {
		idx := v.idx
		keep := func(k load.Key) bool { return k.Tenant == idx }
		vf := VictimFigures{Tenant: v.name, Priority: v.prio,
			Quiet: quiet.Merged(keep).Summary(), Flood: victims.Merged(keep).Summary(),
			QuietErrors: quiet.ErrorsOf(keep), FloodErrors: victims.ErrorsOf(keep),
			QuietOKOps: float64(okOf(quiet, keep)) / o.Duration.Seconds(), FloodOKOps: float64(okOf(victims, keep)) / o.Duration.Seconds()}
		for k := range quiet.Hists {
			if keep(k) {
				vf.QuietOffered += quiet.Hists[k].Count()
			}
		}
		if vf.Quiet.P99Us > 0 {
			vf.Ratio = float64(vf.Flood.P99Us) / float64(vf.Quiet.P99Us)
		}
		vf.Store = storeVictim(v.node, scrape0, scrape1, scrape2)
		or.Victims = append(or.Victims, vf)
	}
	ph.Overload = or
	return ph, nil
}

// writeVictimKeys writes a victim's key space before its quiet run. A put
// that fails (after the client's own retries: an election on a loaded
// machine outlasts them) is tried again, every victimSetupPause, for at
// most leaderWaitMax: setting up is not what the scenario measures.
func writeVictimKeys(ctx context.Context, cl *client.Client, value []byte) error {
	for k := range victimKeys {
		key := fmt.Appendf(nil, "victim-%04d", k)
		deadline := time.Now().Add(leaderWaitMax)
		for {
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			err := cl.Put(octx, key, value)
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				return fmt.Errorf("writing the victims' keys: %w", err)
			}
			time.Sleep(victimSetupPause)
		}
	}
	return nil
}
