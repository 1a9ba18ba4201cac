package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"synod/bench/hist"
	"synod/bench/load"
	"synod/kv/client"
)

func isNotFound(err error) bool { return errors.Is(err, client.ErrNotFound) }

// PhaseResult holds one scenario's figures on one path. Latencies are in
// microseconds.
type PhaseResult struct {
	Scenario      string           `json:"scenario"`
	Read          hist.Summary     `json:"read"`
	Write         hist.Summary     `json:"write"`
	All           hist.Summary     `json:"all"`
	Victim        hist.Summary     `json:"victim"` // steady ops of tenants 2..N
	BulkScan      hist.Summary     `json:"bulk_scan,omitempty"`
	BulkWrite     hist.Summary     `json:"bulk_write,omitempty"`
	BulkErrors    int64            `json:"bulk_errors,omitempty"`
	TenantP99Us   []int64          `json:"tenant_p99_us"` // [t-1]
	ThroughputOps float64          `json:"throughput_ops"`
	Offered       int64            `json:"offered"`
	Done          int64            `json:"done"`
	Errors        int64            `json:"errors"`
	Shed          int64            `json:"shed"`
	ErrorKinds    map[string]int64 `json:"error_kinds,omitempty"`
	LeaderChanges int              `json:"leader_changes"`
	CPUSeconds    float64          `json:"cpu_seconds"`
	// HostStealPct is the share of the machine's CPU time the hypervisor
	// stole over the recorded window, in per cent (host_steal.go); nil:
	// not measured.
	HostStealPct  *float64     `json:"host_steal_pct,omitempty"`
	CPUPer1000    float64      `json:"cpu_seconds_per_1000_ops"`
	ScheduleLagMs float64      `json:"schedule_lag_ms"`
	ReadCurve     []hist.Point `json:"read_curve"`
	WriteCurve    []hist.Point `json:"write_curve"`
	HogNote       string       `json:"hog_note,omitempty"`
	// Cluster is what the nodes' /metrics counted over the recorded
	// window and their footprint at its end (nodestats.go; nil on an
	// existing cluster).
	Cluster *ClusterWindow `json:"cluster,omitempty"`
	// The figures of the ceiling, tail, overload and load scenarios
	// (scenario_*.go); nil in the others.
	Ceiling  *CeilingResult  `json:"ceiling,omitempty"`
	Tail     *TailResult     `json:"tail,omitempty"`
	Overload *OverloadResult `json:"overload,omitempty"`
	Load     *LoadResult     `json:"load,omitempty"`
	// NodeProfiles are the nodes' CPU profiles of the recorded part
	// (--node-profiles; node_profiles.go), NodeProfileErrors the nodes
	// that gave none.
	NodeProfiles      []string `json:"node_profiles,omitempty"`
	NodeProfileErrors []string `json:"node_profile_errors,omitempty"`
}

// PathResult is one path's run.
type PathResult struct {
	Path
	Status string                  `json:"status"` // ok | n/a | failed
	Reason string                  `json:"reason,omitempty"`
	Phases map[string]*PhaseResult `json:"phases"`
	// Interference: victim P99 with the noisy neighbour over without.
	VictimP99SteadyUs int64   `json:"victim_p99_steady_us"`
	VictimP99NoisyUs  int64   `json:"victim_p99_noisy_us"`
	InterferenceRatio float64 `json:"interference_ratio"`
	LeaderChangesHog  int     `json:"leader_changes_hog"`
	// KernelUDPDatagrams (netns paths only): datagrams the node
	// namespaces' kernel UDP stacks counted over the whole run (preload
	// included); AF_XDP consensus bypasses them, kernel udp does not.
	KernelUDPDatagrams int64 `json:"kernel_udp_datagrams,omitempty"`
}

// runPath runs every scenario of o on a fresh cluster for p (or on the
// given endpoints).
func runPath(ctx context.Context, o *Options, kvnode string, p Path, bar *progress) *PathResult {
	pr := &PathResult{Path: p, Phases: map[string]*PhaseResult{}}
	var c *cluster
	var err error
	if len(o.Endpoints) > 0 {
		c = &cluster{path: p, endpoints: o.Endpoints, monitor: o.Token, benchToken: o.Token}
		for range o.Tenants {
			c.tokens = append(c.tokens, o.Token)
		}
	} else {
		c, err = startCluster(ctx, o, kvnode, p)
		if err != nil {
			pr.Status, pr.Reason = "n/a", err.Error()
			return pr
		}
	}
	defer c.stop()
	if p.resp {
		return runRESPBench(ctx, o, c, pr) // redis-benchmark, not kvbench's workload (resp.go)
	}
	w, err := newWorkload(ctx, o, c.endpoints, c.tokens)
	if err != nil {
		pr.Status, pr.Reason = "failed", err.Error()
		return pr
	}
	defer w.close()
	if err := w.preload(ctx); err != nil {
		pr.Status, pr.Reason = "failed", err.Error()
		return pr
	}
	lw := watchLeaders(c)
	defer lw.close()
	scen := scenariosFor(o, p)
	st := &pathRun{}
	for _, s := range scen {
		if ctx.Err() != nil {
			break
		}
		bar.describe(fmt.Sprintf("%-16s %-6s", p.Name, s))
		// The first phase also absorbs the aftermath of the preload
		// (memtable flushes, compactions, snapshots) before recording.
		warm := o.Warmup
		if len(pr.Phases) == 0 {
			warm += o.Settle
		}
		ph, err := runScenario(ctx, o, c, w, lw, st, s, warm, bar)
		if err != nil {
			pr.Status, pr.Reason = "failed", fmt.Sprintf("%s: %v", s, err)
			return pr
		}
		pr.Phases[s] = ph
	}
	pr.Status = "ok"
	if c.lan != nil {
		n, err := c.lan.kernelUDP()
		if err != nil {
			pr.Status, pr.Reason = "failed", fmt.Sprintf("kernel UDP count: %v", err)
			return pr
		}
		pr.KernelUDPDatagrams = n
	}
	if st, ok := pr.Phases["steady"]; ok {
		pr.VictimP99SteadyUs = st.Victim.P99Us
		if ns, ok := pr.Phases["noisy"]; ok {
			pr.VictimP99NoisyUs = ns.Victim.P99Us
			if st.Victim.P99Us > 0 {
				pr.InterferenceRatio = float64(ns.Victim.P99Us) / float64(st.Victim.P99Us)
			}
		}
	}
	if h, ok := pr.Phases["hog"]; ok {
		pr.LeaderChangesHog = h.LeaderChanges
	}
	return pr
}

// scenariosFor lists the scenarios of o that path p runs, in the order of
// allScenarios: every one on a main path; on an ablation steady and the
// per-path figures (ceiling, tail); steady only on resp (redis-benchmark
// drives it); no hog or load on an existing cluster (kvbench can neither
// pin, starve nor restart another cluster's processes).
func scenariosFor(o *Options, p Path) []string {
	var out []string
	for _, s := range allScenarios {
		if !o.has(s) {
			continue
		}
		switch {
		case len(o.Endpoints) > 0 && (s == scenHog || s == scenLoad):
			continue
		case p.resp && s != scenSteady:
			continue
		case len(o.Endpoints) == 0 && !p.main && s != scenSteady && s != scenCeiling && s != scenTail:
			continue
		}
		out = append(out, s)
	}
	if p.resp && len(out) == 0 {
		out = []string{scenSteady} // redis-benchmark's column is the path
	}
	return out
}

// runPhase runs one scenario: the steady open-loop load, plus tenant 1's
// bursts (noisy) or a CPU hog pinned with the leader (hog).
func runPhase(ctx context.Context, o *Options, c *cluster, w *workload, lw *leaderWatch, scenario string, warmup time.Duration, bar *progress) (*PhaseResult, error) {
	ph := &PhaseResult{Scenario: scenario}
	var (
		noisyStop chan struct{}
		noisyDone chan *noisyStats
		h         *hog
		leaderPID int
	)
	switch scenario {
	case "noisy":
		noisyStop, noisyDone = make(chan struct{}), make(chan *noisyStats, 1)
		go func() { noisyDone <- w.noisy(noisyStop) }()
	case "hog":
		if len(c.procs) == 0 {
			ph.HogNote = "existing cluster: no hog (kvbench does not control its processes)"
			break
		}
		pid, err := c.leaderPID(ctx)
		if err != nil {
			return nil, err
		}
		leaderPID = pid
		cpus := make([]int, min(max(o.HogCPUs, 1), numCPU()))
		for i := range cpus {
			cpus[i] = i
		}
		if err := pinProcess(pid, cpus); err != nil {
			ph.HogNote = fmt.Sprintf("leader not pinned: %v", err)
		} else {
			ph.HogNote = fmt.Sprintf("leader (pid %d) pinned to CPUs %v with a process burning them", pid, cpus)
		}
		if h, err = startHog(cpus); err != nil {
			pinProcess(pid, nil)
			return nil, err
		}
	}
	// CPU of the nodes over the recorded window only.
	var cpuMu sync.Mutex
	var cpu0, cpu1 float64
	var host0, host1 hostCPU
	t0Done, t1Done := make(chan struct{}), make(chan struct{})
	var win *windowWatch // the nodes' /metrics over the window (nodestats.go)
	t0 := time.AfterFunc(warmup, func() {
		defer close(t0Done)
		v, h := c.cpuSum(), readHostCPU()
		ww := c.openWindow(ctx)
		cpuMu.Lock()
		cpu0, host0, win = v, h, ww
		cpuMu.Unlock()
		lw.reset()
	})
	var changesAtEnd int
	endWindow := func() {
		v, h := c.cpuSum(), readHostCPU()
		cpuMu.Lock()
		cpu1, host1 = v, h
		changesAtEnd = lw.count()
		ww := win
		cpuMu.Unlock()
		if ww != nil {
			ph.Cluster = ww.close(ctx)
		}
	}
	t1 := time.AfterFunc(warmup+o.Duration, func() { defer close(t1Done); endWindow() })
	res := load.Run(ctx, load.Config{Rate: o.Rate, Warmup: warmup, Duration: o.Duration,
		Concurrency: o.Concurrency, Seed: o.Seed + uint64(len(scenario)), DrainTimeout: 2 * opTimeout,
		Progress: bar.phase}, w.steadyPick)
	// The schedule may end (and drain) a hair before the timers fire:
	// then take the end-of-window figures now; if a timer is firing,
	// wait for it to finish.
	if !t0.Stop() {
		<-t0Done
	}
	if t1.Stop() {
		endWindow()
	} else {
		<-t1Done
	}
	if noisyStop != nil {
		close(noisyStop)
		ns := <-noisyDone
		ph.BulkScan, ph.BulkWrite, ph.BulkErrors = ns.scan.Summary(), ns.write.Summary(), ns.errors
	}
	if h != nil {
		h.stop()
		pinProcess(leaderPID, nil)
	}
	cpuMu.Lock()
	ph.LeaderChanges = changesAtEnd
	if cpu1 > cpu0 && len(c.procs) > 0 {
		ph.CPUSeconds = cpu1 - cpu0
	}
	ph.HostStealPct = stealPct(host0, host1)
	cpuMu.Unlock()

	isRead := func(k load.Key) bool { return k.Class == classRead }
	isWrite := func(k load.Key) bool { return k.Class == classWrite }
	all := func(load.Key) bool { return true }
	victim := func(k load.Key) bool { return k.Tenant != 1 }
	rh, wh := res.Merged(isRead), res.Merged(isWrite)
	ph.Read, ph.Write, ph.All = rh.Summary(), wh.Summary(), res.Merged(all).Summary()
	ph.Victim = res.Merged(victim).Summary()
	ph.ReadCurve, ph.WriteCurve = rh.Curve(), wh.Curve()
	for t := 1; t <= o.Tenants; t++ {
		ph.TenantP99Us = append(ph.TenantP99Us, res.Merged(func(k load.Key) bool { return k.Tenant == t }).Summary().P99Us)
	}
	ph.Offered, ph.Done, ph.Shed = res.Offered, res.Done, res.Shed
	ph.Errors = res.ErrorsOf(all)
	ph.ErrorKinds = res.ErrorKinds
	ph.ThroughputOps = float64(res.Done-ph.Errors+res.Shed) / o.Duration.Seconds()
	if ph.ThroughputOps < 0 {
		ph.ThroughputOps = 0
	}
	if ok := res.Done - ph.Errors + res.Shed; ok > 0 && ph.CPUSeconds > 0 {
		ph.CPUPer1000 = ph.CPUSeconds / float64(ok) * 1000
	}
	ph.ScheduleLagMs = float64(res.ScheduleLag.Microseconds()) / 1000
	return ph, nil
}
