// Command kvbench compares synod's replication paths side by side on the
// same machine, workload and storage, and reports the tail, not the mean.
//
//	kvbench              quick scaled reference workload (about a minute on 2 cores)
//	kvbench --full       the long run
//	kvbench --paths raft,paxos --scenarios steady --rate 3000
//	kvbench --paths raft,paxos --scenarios load   10 GiB of 4 KiB values, then a follower restart
//	kvbench --endpoints 127.0.0.1:7001,... --token T   an existing cluster
//	kvbench rtt          AF_XDP vs kernel UDP round trips (afxdp/rtt)
//
// Every path runs on a fresh embedded cluster of kvnode child processes on
// loopback, or (paxos-udp-netns, paxos-afxdp; root only) each in a network
// namespace of its own on a veth bridge. Load is open-loop Poisson; latency counts from the intended
// send time. Scenarios: steady, noisy and hog (the tenants' workload), and
// ceiling, tail, overload and load (scenario_*.go: capacity closed loop,
// the tail at half of it, a flood at 1.5x it, a store loaded to GiBs).
// docs/benchmarking.md explains the method, the knobs and how to read the
// output.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "hog":
			if err := hogMain(os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			return
		case "victims":
			if err := victimsMain(os.Stdin, os.Stdout); err != nil { // victims_process.go
				fmt.Fprintf(os.Stderr, "kvbench victims: %v\n", err)
				os.Exit(1)
			}
			return
		case "stalls":
			if err := stallsMain(os.Args[2:], os.Stdout); err != nil { // stalltrace.go
				fmt.Fprintf(os.Stderr, "kvbench stalls: %v\n", err)
				os.Exit(1)
			}
			return
		case "rtt":
			if err := rttMain(os.Args[2:]); err != nil {
				fmt.Fprintf(os.Stderr, "kvbench rtt: %v\n", err)
				os.Exit(1)
			}
			return
		}
	}
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench: %v\n", err)
		os.Exit(2)
	}
	stopProfile := func() {}
	if o.CPUProfile != "" {
		if stopProfile, err = startCPUProfile(o.CPUProfile); err != nil {
			fmt.Fprintf(os.Stderr, "kvbench: %v\n", err)
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	r, err := run(ctx, o)
	stop()
	stopProfile() // before any exit: an unfinished profile is unreadable
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench: %v\n", err)
		os.Exit(1)
	}
	writeTable(os.Stdout, r)
	for _, p := range r.Paths {
		if p.Status == "failed" {
			os.Exit(1)
		}
	}
}

// startCPUProfile profiles kvbench's own process into path until stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "kvbench: the CPU profile: %v\n", err)
		}
	}, nil
}

func parseFlags(args []string) (*Options, error) {
	fs := flag.NewFlagSet("kvbench", flag.ContinueOnError)
	full := fs.Bool("full", false, "the long run (5 replicas, 30 s phases)")
	tiny := fs.Bool("tiny", false, "smoke-test scale (seconds)")
	// Knobs; their defaults come from the preset, applied after parsing.
	var (
		nodes, tenants, keys, valueBytes, conc, burst, scanLimit, batchOps, hogCPUs, basePort int
		readRatio, zipfS, rate, contract                                                      float64
		dist, paths, scenarios, endpoints, token, kvnode, out, dataDir                        string
		warmup, duration, period, settle                                                      time.Duration
		seed                                                                                  uint64
		noPlots, quiet, victimsInline                                                         bool
	)
	fs.IntVar(&nodes, "nodes", 0, "replicas per cluster")
	fs.IntVar(&tenants, "tenants", 0, "tenants (tenant 1 is the noisy neighbour)")
	fs.Float64Var(&readRatio, "read-ratio", -1, "fraction of GETs in the steady load")
	fs.IntVar(&keys, "keys", 0, "keys per tenant (preloaded)")
	fs.StringVar(&dist, "dist", "", "key distribution: uniform or zipf")
	fs.Float64Var(&zipfS, "zipf-s", 0, "zipf exponent (> 1)")
	fs.IntVar(&valueBytes, "value-bytes", 0, "PUT value size")
	fs.Float64Var(&rate, "rate", 0, "offered steady ops/s, all tenants together")
	fs.DurationVar(&warmup, "warmup", -1, "unrecorded start of every phase")
	fs.DurationVar(&duration, "duration", 0, "recorded length of every phase")
	fs.DurationVar(&settle, "settle", -1, "extra unrecorded load before a cluster's first phase")
	fs.IntVar(&conc, "concurrency", 0, "operations in flight (arrivals beyond wait; the wait counts)")
	fs.Uint64Var(&seed, "seed", 0, "schedule and key seed")
	fs.DurationVar(&period, "noisy-period", 0, "noisy tenant: time between bursts")
	fs.IntVar(&burst, "noisy-burst", -1, "noisy tenant: bulk operations per burst")
	fs.IntVar(&scanLimit, "scan-limit", 0, "noisy tenant: keys per bulk SCAN (<= 1000)")
	fs.IntVar(&batchOps, "batch-ops", 0, "noisy tenant: PUTs per bulk BATCH (<= 128)")
	fs.Float64Var(&contract, "contract-factor", 0, "victims' contract = this x their share of --rate")
	fs.IntVar(&hogCPUs, "hog-cpus", 0, "CPUs the hog burns and the leader is pinned to")
	fs.StringVar(&paths, "paths", "", "comma-separated paths (default all): "+pathNames())
	fs.StringVar(&scenarios, "scenarios", "", "comma-separated (default all but load): "+strings.Join(allScenarios, ","))
	fs.StringVar(&endpoints, "endpoints", "", "an existing cluster's client addresses (no embedded cluster)")
	fs.StringVar(&token, "token", "", "with --endpoints: the token every tenant uses")
	fs.StringVar(&kvnode, "kvnode", "", "kvnode binary (default: next to kvbench, in PATH, or built with go build)")
	fs.StringVar(&out, "out", "", "output directory for kvbench.json and PNGs")
	fs.StringVar(&dataDir, "data-dir", "", "where clusters keep data (default: the temp dir; must be a disk for fsync-file)")
	fs.IntVar(&basePort, "base-port", 0, "first loopback port (clients base+1.., consensus base+21..)")
	var (
		ceilInflight, loadStep, loadWriters, pmemMiB int
		snapTransfer                                 string
		tailShare, overFactor, victimRate, loadGiB   float64
		capacity                                     float64
		loadDown, loadStall, loadCatchup, loadTime   time.Duration
	)
	fs.IntVar(&ceilInflight, "ceiling-inflight", 0, "ceiling: closed-loop requests in flight measuring capacity")
	fs.Float64Var(&tailShare, "tail-share", 0, "tail: offered load as a share of the measured capacity")
	fs.Float64Var(&overFactor, "overload-factor", 0, "overload: the flood's offered load over the measured capacity")
	fs.Float64Var(&victimRate, "victim-rate", 0, "overload: each victim tenant's offered ops/s")
	fs.Float64Var(&capacity, "capacity", 0, "tail, overload: scale from this capacity (puts/s) instead of measuring it (0: measure; the ceiling scenario still measures its own)")
	fs.Float64Var(&loadGiB, "load-gib", 0, "load: GiB of 4 KiB values to load")
	fs.IntVar(&loadStep, "load-step-mib", 0, "load: one report row per this many MiB loaded (default 1024, or an eighth of --load-gib below 2 GiB)")
	fs.IntVar(&loadWriters, "load-writers", 0, "load: closed-loop writers")
	fs.DurationVar(&loadDown, "load-down", -1, "load: how long a follower is down at the end (the load goes on)")
	fs.DurationVar(&loadStall, "load-stall", 0, "load: end the load when nothing is acknowledged for this long")
	fs.DurationVar(&loadCatchup, "load-catchup-max", 0, "load: how long to wait for the restarted follower to catch up")
	fs.DurationVar(&loadTime, "load-time-max", 0, "load: end the load (as cut off, with what it loaded) after loading this long")
	fs.IntVar(&pmemMiB, "pmem-mib", 0, "paxos acceptor log size in MiB (default 64, or 256 with the load scenario)")
	fs.StringVar(&snapTransfer, "snapshot-transfer", "", "paxos nodes' [consensus] snapshot_transfer: whole (kvnode's default) or delta")
	fs.BoolVar(&noPlots, "no-plots", false, "skip the PNG plots")
	fs.BoolVar(&victimsInline, "victims-inline", false, "overload: run the victims in kvbench's own process, beside the flood's generator (default: a child process of their own)")
	fs.BoolVar(&quiet, "quiet", false, "no progress bar")
	nodeProfiles := fs.Bool("node-profiles", false, "profile every node's CPU during the recorded part of the tail and overload scenarios, into --out/profiles/PATH/")
	cpuProfile := fs.String("cpuprofile", "", "write kvbench's own CPU profile here (what the load generator costs the cores it shares with the nodes)")
	stallFlags := addStallFlags(fs) // stages.go
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (subcommands: rtt)", fs.Arg(0))
	}
	o := quickOptions()
	switch {
	case *full && *tiny:
		return nil, errors.New("--full and --tiny exclude each other")
	case *full:
		o = fullOptions()
	case *tiny:
		o = tinyOptions()
	}
	setI := func(dst *int, v int) {
		if v > 0 {
			*dst = v
		}
	}
	setF := func(dst *float64, v float64) {
		if v > 0 {
			*dst = v
		}
	}
	setI(&o.Nodes, nodes)
	setI(&o.Tenants, tenants)
	setI(&o.Keys, keys)
	setI(&o.ValueBytes, valueBytes)
	setI(&o.Concurrency, conc)
	setI(&o.ScanLimit, scanLimit)
	setI(&o.BatchOps, batchOps)
	setI(&o.HogCPUs, hogCPUs)
	setI(&o.BasePort, basePort)
	setF(&o.ZipfS, zipfS)
	setF(&o.Rate, rate)
	setF(&o.ContractFactor, contract)
	setI(&o.CeilingInflight, ceilInflight)
	setI(&o.LoadWriters, loadWriters)
	setI(&o.PMemMiB, pmemMiB)
	o.SnapshotTransfer = snapTransfer
	o.CPUProfile = *cpuProfile
	o.NodeProfiles = *nodeProfiles
	setF(&o.TailShare, tailShare)
	setF(&o.OverloadFactor, overFactor)
	setF(&o.VictimRate, victimRate)
	setF(&o.Capacity, capacity)
	setF(&o.LoadGiB, loadGiB)
	if loadStep > 0 {
		o.LoadStepMiB = loadStep
	} else if loadGiB > 0 {
		o.LoadStepMiB = loadStepDefault(loadGiB)
	}
	if loadDown >= 0 {
		o.LoadDown = loadDown
	}
	if loadStall > 0 {
		o.LoadStall = loadStall
	}
	if loadCatchup > 0 {
		o.LoadCatchupMax = loadCatchup
	}
	if loadTime != 0 { // a negative one is refused by validate
		o.LoadTimeMax = loadTime
	}
	if readRatio >= 0 {
		o.ReadRatio = readRatio
	}
	if burst >= 0 {
		o.NoisyBurst = burst
	}
	if dist != "" {
		o.Dist = dist
	}
	if warmup >= 0 {
		o.Warmup = warmup
	}
	if duration > 0 {
		o.Duration = duration
	}
	if settle >= 0 {
		o.Settle = settle
	}
	if period > 0 {
		o.NoisyPeriod = period
	}
	if seed > 0 {
		o.Seed = seed
	}
	if paths != "" {
		o.Paths = strings.Split(paths, ",")
	}
	if scenarios != "" {
		o.Scenarios = strings.Split(scenarios, ",")
	}
	if endpoints != "" {
		o.Endpoints = strings.Split(endpoints, ",")
		if token == "" {
			return nil, errors.New("--endpoints needs --token")
		}
		o.Token = token
	}
	o.Kvnode = kvnode
	if out != "" {
		o.OutDir = out
	}
	o.DataDir = dataDir
	o.NoPlots = o.NoPlots || noPlots
	o.VictimsInline = victimsInline
	o.Quiet = o.Quiet || quiet
	stallFlags.apply(&o)
	if err := o.validate(); err != nil {
		return nil, err
	}
	return &o, nil
}

func pathNames() string {
	var n []string
	for _, p := range allPaths() {
		n = append(n, p.Name)
	}
	return strings.Join(n, ",")
}

// selectPaths returns the paths o names (all by default), in the order of
// allPaths. With --endpoints one path runs: the cluster that is there.
func selectPaths(o *Options) ([]Path, error) {
	if len(o.Endpoints) > 0 {
		return []Path{{Name: "existing", Replication: "unknown", Durability: "unknown (an existing cluster: as it is configured)", Transport: "unknown", Topology: "unknown", main: true}}, nil
	}
	all := allPaths()
	if len(o.Paths) == 0 {
		return all, nil
	}
	var out []Path
	for _, name := range o.Paths {
		found := false
		for _, p := range all {
			if p.Name == name {
				out = append(out, p)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("--paths: unknown path %q (known: %s)", name, pathNames())
		}
	}
	return out, nil
}

// notAvailable says why a path cannot run here, before trying it.
func notAvailable(p Path) string {
	if p.netns {
		return netnsUnavailable()
	}
	if _, err := exec.LookPath("redis-benchmark"); p.resp && err != nil {
		return "redis-benchmark not installed (apt-get install redis-tools)"
	}
	return ""
}

// run runs every selected path and writes the JSON and plots.
func run(ctx context.Context, o *Options) (*Report, error) {
	paths, err := selectPaths(o)
	if err != nil {
		return nil, err
	}
	if o.DataDir == "" {
		o.DataDir = os.TempDir()
	}
	r := &Report{Started: time.Now().UTC(), Machine: describeMachine(o.DataDir), Options: *o}
	host0 := readHostCPU()
	var bin string
	if len(o.Endpoints) == 0 {
		var cleanup func()
		if bin, cleanup, err = findKvnode(o.Kvnode); err != nil {
			return nil, err
		}
		defer cleanup()
	}
	phases := 0
	for _, p := range paths {
		phases += len(scenariosFor(o, p))
	}
	bar := newProgress(phases, o.Quiet)
	for _, p := range paths {
		n := len(scenariosFor(o, p))
		if why := notAvailable(p); why != "" {
			r.Paths = append(r.Paths, &PathResult{Path: p, Status: "n/a", Reason: why, Phases: map[string]*PhaseResult{}})
			bar.skip(n)
			continue
		}
		if ctx.Err() != nil {
			break
		}
		pr := runPath(ctx, o, bin, p, bar)
		if pr.Status != "ok" {
			bar.skip(n - len(pr.Phases))
		}
		r.Paths = append(r.Paths, pr)
	}
	bar.finish()
	r.Elapsed = time.Since(r.Started).Round(time.Second).String()
	r.HostStealPct = stealPct(host0, readHostCPU())
	r.headline()
	if r.HostStealPct != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("host steal: the hypervisor took %.1f %% of this machine's CPU time over the run (per scenario: the \"host steal %%\" rows); figures from a run with much of it are the host's, not the store's", *r.HostStealPct))
	}
	if len(o.Endpoints) == 0 {
		r.Notes = append(r.Notes, "each path ran on a fresh cluster; ablations ran the steady, ceiling and tail scenarios only")
	} else {
		r.Notes = append(r.Notes, "an existing cluster: no hog scenario and no CPU figures (kvbench does not control its processes)")
	}
	if r.Machine.CPUs <= 2 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d-CPU machine: the client, every replica and the hog share the same cores, so absolute figures include scheduler contention", r.Machine.CPUs))
	}
	jp, err := writeJSON(o.OutDir, r)
	if err != nil {
		return r, err
	}
	r.Notes = append(r.Notes, "figures: "+jp)
	if !o.NoPlots {
		files, err := writePlots(o.OutDir, r)
		if err != nil {
			r.Notes = append(r.Notes, "plots failed: "+err.Error())
		} else if len(files) > 0 {
			r.Notes = append(r.Notes, "plots: "+strings.Join(files, ", "))
		}
	}
	return r, nil
}

// findKvnode returns a kvnode binary: the flag, one next to this
// executable, one in PATH, or one built now with `go build` (inside the
// synod module).
func findKvnode(flagPath string) (string, func(), error) {
	none := func() {}
	if flagPath != "" {
		return flagPath, none, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "kvnode")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, none, nil
		}
	}
	if p, err := exec.LookPath("kvnode"); err == nil {
		return p, none, nil
	}
	dir, err := os.MkdirTemp("", "kvbench-bin-")
	if err != nil {
		return "", none, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	bin := filepath.Join(dir, "kvnode")
	cmd := exec.Command("go", "build", "-o", bin, "synod/cmd/kvnode")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	fmt.Fprintln(os.Stderr, "kvbench: building kvnode (go build synod/cmd/kvnode) ...")
	if err := cmd.Run(); err != nil {
		cleanup()
		return "", none, fmt.Errorf("no kvnode binary (give --kvnode, or run inside the synod module): go build: %w", err)
	}
	return bin, cleanup, nil
}
