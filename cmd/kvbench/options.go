package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Options are kvbench's knobs (docs/benchmarking.md describes each).
type Options struct {
	Nodes       int           // replicas per embedded cluster
	Tenants     int           // tenants; tenant 1 is the noisy neighbour, the rest are victims
	ReadRatio   float64       // fraction of steady operations that are GETs
	Keys        int           // keys per tenant (preloaded)
	Dist        string        // uniform | zipf
	ZipfS       float64       // zipf exponent (> 1)
	ValueBytes  int           // value size of PUTs
	Rate        float64       // offered steady ops/s, all tenants together
	Warmup      time.Duration // unrecorded start of every phase
	Duration    time.Duration // recorded part of every phase
	Settle      time.Duration // extra unrecorded load before a cluster's first phase (after the preload)
	Concurrency int           // operations in flight (open loop: arrivals beyond wait, and the wait counts)
	Seed        uint64

	// Noisy neighbour: every NoisyPeriod, tenant 1 fires NoisyBurst bulk
	// operations (alternately a SCAN of ScanLimit keys and a BATCH of
	// BatchOps PUTs), many times its contract.
	NoisyPeriod time.Duration
	NoisyBurst  int
	ScanLimit   int
	BatchOps    int
	// ContractFactor: each victim's contract (ops/s) is this many times
	// its share of Rate; the noisy tenant's contract is its share exactly.
	ContractFactor float64

	// HogCPUs: CPUs the CPU hog burns (and the leader is pinned to).
	HogCPUs int

	// StallOptions: the nodes' stall detector (stages.go).
	StallOptions

	// The ceiling, tail, overload and load scenarios (scenario_*.go).
	// CeilingInflight: requests in flight in the closed loop that
	// measures a path's capacity (puts/s).
	CeilingInflight int
	// TailShare: the tail scenario offers this share of the capacity,
	// open loop.
	TailShare float64
	// OverloadFactor: the overload scenario's flood offers this many
	// times the capacity; VictimRate is each victim tenant's offered
	// ops/s beside it (and alone, for the quiet baseline).
	OverloadFactor float64
	VictimRate     float64
	// VictimsInline runs the overload scenario's victims in kvbench's own
	// process, beside the flood's generator, rather than in a child of
	// their own (victims_process.go).
	VictimsInline bool
	// Capacity, when > 0, is the capacity (puts/s) the tail and overload
	// scenarios scale from instead of one measured on the path: variants
	// compared side by side then get the same offered load.
	Capacity float64
	// LoadGiB of 4 KiB values with unique keys; one report row per
	// LoadStepMiB; LoadWriters closed-loop writers. Then a follower is
	// down for LoadDown while the load goes on, and is restarted;
	// LoadCatchupMax bounds the wait for it to catch up. LoadStall ends
	// the load when nothing was acknowledged for that long; LoadTimeMax
	// ends it (as cut off, with what it loaded) after that long loading,
	// so that a slow machine still reports its rows and the restart.
	LoadGiB        float64
	LoadStepMiB    int
	LoadWriters    int
	LoadDown       time.Duration
	LoadStall      time.Duration
	LoadCatchupMax time.Duration
	LoadTimeMax    time.Duration
	// PMemMiB sizes every paxos node's acceptor log (0: 64 MiB, or
	// kvnode's own default of 256 MiB when the load scenario runs).
	PMemMiB int
	// SnapshotTransfer is every paxos node's [consensus]
	// snapshot_transfer ("": kvnode's default, whole; or "delta").
	SnapshotTransfer string
	// CPUProfile, when set, is where kvbench writes its own CPU profile.
	CPUProfile string
	// NodeProfiles: the nodes serve pprof and kvbench profiles them
	// during the tail and overload scenarios (node_profiles.go).
	NodeProfiles bool

	Paths     []string // which paths to run ("" = all)
	Scenarios []string // steady, noisy, ceiling, tail, overload, hog, load (allScenarios)
	Endpoints []string // an existing cluster: no embedded cluster is started
	Token     string   // with Endpoints: one tenant's token (used for every tenant)
	Kvnode    string   // kvnode binary ("" = find or build)
	OutDir    string
	DataDir   string // where embedded clusters keep data ("" = a temp dir on disk)
	BasePort  int
	Full      bool
	NoPlots   bool
	Quiet     bool // no progress bar
	// Tiny shortens everything to seconds (smoke tests).
	Tiny bool
}

// Limits on the knobs.
const (
	nodesMax       = 7
	tenantsMax     = 1024
	keysMax        = 10_000_000
	rateMax        = 1_000_000
	concurrencyMax = 100_000
	valueBytesMax  = 1 << 20
	inflightMax    = 4096
	loadGiBMax     = 1024
	loadWritersMax = 1024
	pmemMiBMax     = 64 << 10
)

// Scenario names, in the order a path runs them: the hog starves the
// leader and the load stops a follower, so they come last.
const (
	scenSteady   = "steady"
	scenNoisy    = "noisy"
	scenCeiling  = "ceiling"
	scenTail     = "tail"
	scenOverload = "overload"
	scenHog      = "hog"
	scenLoad     = "load"
)

var allScenarios = []string{scenSteady, scenNoisy, scenCeiling, scenTail, scenOverload, scenHog, scenLoad}

// defaultScenarios are every scenario but load (which writes GiBs).
var defaultScenarios = []string{scenSteady, scenNoisy, scenCeiling, scenTail, scenOverload, scenHog}

// quickOptions scales the reference workload (5 nodes RF 3, 32 tenants,
// 70/30, one noisy tenant) to a 2-core machine and about a minute for
// the main paths: 3 replicas (RF 3), short phases.
func quickOptions() Options {
	return Options{
		Nodes: 3, Tenants: 32, ReadRatio: 0.7, Keys: 1000, Dist: "zipf", ZipfS: 1.1, ValueBytes: 128,
		Rate: 1000, Warmup: 1 * time.Second, Duration: 3 * time.Second, Settle: 2 * time.Second, Concurrency: 1024, Seed: 1,
		NoisyPeriod: 200 * time.Millisecond, NoisyBurst: 32, ScanLimit: 1000, BatchOps: 64, ContractFactor: 4,
		HogCPUs: 1, Scenarios: defaultScenarios, OutDir: "out/kvbench", BasePort: 17000,
		CeilingInflight: 256, TailShare: 0.5, OverloadFactor: 1.5, VictimRate: 100,
		LoadGiB: 10, LoadStepMiB: 1024, LoadWriters: 16, LoadDown: 60 * time.Second,
		LoadStall: 2 * time.Minute, LoadCatchupMax: 10 * time.Minute, LoadTimeMax: loadTimeMaxDefault,
	}
}

// fullOptions is the long run: 5 replicas as the reference setup's
// cluster (one group, so RF 5 — kvnode has no sharding), more keys,
// longer phases.
func fullOptions() Options {
	o := quickOptions()
	o.Full = true
	o.Nodes = 5
	o.Keys = 10000
	o.Rate = 3000
	o.Warmup = 5 * time.Second
	o.Duration = 30 * time.Second
	o.Settle = 10 * time.Second
	return o
}

// tinyOptions is the smoke-test scale.
func tinyOptions() Options {
	o := quickOptions()
	o.Tiny = true
	o.Tenants = 4
	o.Keys = 50
	o.Rate = 200
	o.Warmup = 100 * time.Millisecond
	o.Duration = 600 * time.Millisecond
	o.Settle = 0
	o.NoisyBurst = 2
	o.ScanLimit = 50
	o.BatchOps = 8
	o.NoPlots = false
	o.Quiet = true
	o.VictimRate = 20
	o.LoadGiB = 2.0 / 1024 // 2 MiB
	o.LoadStepMiB = 1
	o.LoadWriters = 4
	o.LoadDown = 500 * time.Millisecond
	o.LoadStall = 20 * time.Second
	o.LoadCatchupMax = 30 * time.Second
	o.LoadTimeMax = time.Minute
	return o
}

func (o *Options) validate() error {
	switch {
	case o.Nodes < 1 || o.Nodes > nodesMax:
		return fmt.Errorf("--nodes %d outside 1..%d", o.Nodes, nodesMax)
	case o.Tenants < 2 || o.Tenants > tenantsMax:
		return fmt.Errorf("--tenants %d outside 2..%d (tenant 1 is the noisy one)", o.Tenants, tenantsMax)
	case o.ReadRatio < 0 || o.ReadRatio > 1:
		return fmt.Errorf("--read-ratio %v outside [0, 1]", o.ReadRatio)
	case o.Keys < 1 || o.Keys > keysMax:
		return fmt.Errorf("--keys %d outside 1..%d", o.Keys, keysMax)
	case o.Dist != "uniform" && o.Dist != "zipf":
		return fmt.Errorf("--dist %q is not uniform or zipf", o.Dist)
	case o.Dist == "zipf" && o.ZipfS <= 1:
		return fmt.Errorf("--zipf-s %v must be > 1", o.ZipfS)
	case o.ValueBytes < 1 || o.ValueBytes > valueBytesMax:
		return fmt.Errorf("--value-bytes %d outside 1..%d", o.ValueBytes, valueBytesMax)
	case o.Rate <= 0 || o.Rate > rateMax:
		return fmt.Errorf("--rate %v outside (0, %d]", o.Rate, rateMax)
	case o.Duration <= 0 || o.Warmup < 0:
		return errors.New("--duration must be > 0 and --warmup >= 0")
	case o.Concurrency < 1 || o.Concurrency > concurrencyMax:
		return fmt.Errorf("--concurrency %d outside 1..%d", o.Concurrency, concurrencyMax)
	case o.NoisyPeriod <= 0 || o.NoisyBurst < 0 || o.ScanLimit < 1 || o.ScanLimit > 1000 || o.BatchOps < 1 || o.BatchOps > 128:
		return errors.New("noisy knobs: period > 0, burst >= 0, scan limit 1..1000, batch ops 1..128")
	case o.ContractFactor <= 0:
		return errors.New("--contract-factor must be > 0")
	case o.CeilingInflight < 1 || o.CeilingInflight > inflightMax:
		return fmt.Errorf("--ceiling-inflight %d outside 1..%d", o.CeilingInflight, inflightMax)
	case o.TailShare <= 0 || o.TailShare > 1:
		return fmt.Errorf("--tail-share %v outside (0, 1]", o.TailShare)
	case o.OverloadFactor <= 0 || o.OverloadFactor > 10:
		return fmt.Errorf("--overload-factor %v outside (0, 10]", o.OverloadFactor)
	case o.Capacity < 0 || o.Capacity > rateMax:
		return fmt.Errorf("--capacity %v outside [0, %d]", o.Capacity, rateMax)
	case o.VictimRate <= 0 || o.VictimRate > rateMax:
		return fmt.Errorf("--victim-rate %v outside (0, %d]", o.VictimRate, rateMax)
	case o.LoadGiB <= 0 || o.LoadGiB > loadGiBMax:
		return fmt.Errorf("--load-gib %v outside (0, %d]", o.LoadGiB, loadGiBMax)
	case o.LoadStepMiB < 1 || float64(o.LoadStepMiB) > o.LoadGiB*1024:
		return fmt.Errorf("--load-step-mib %d outside 1..--load-gib in MiB (%.0f)", o.LoadStepMiB, o.LoadGiB*1024)
	case o.LoadWriters < 1 || o.LoadWriters > loadWritersMax:
		return fmt.Errorf("--load-writers %d outside 1..%d", o.LoadWriters, loadWritersMax)
	case o.LoadDown < 0 || o.LoadStall <= 0 || o.LoadCatchupMax <= 0 || o.LoadTimeMax <= 0:
		return errors.New("--load-down must be >= 0, --load-stall, --load-catchup-max and --load-time-max > 0")
	case o.PMemMiB < 0 || o.PMemMiB > pmemMiBMax:
		return fmt.Errorf("--pmem-mib %d outside 0..%d", o.PMemMiB, pmemMiBMax)
	case o.SnapshotTransfer != "" && o.SnapshotTransfer != "delta" && o.SnapshotTransfer != "whole":
		return fmt.Errorf("--snapshot-transfer %q is not one of delta, whole", o.SnapshotTransfer)
	}
	for _, s := range o.Scenarios {
		if !slices.Contains(allScenarios, s) {
			return fmt.Errorf("--scenarios: %q is not one of %s", s, strings.Join(allScenarios, ", "))
		}
	}
	return nil
}

// has reports whether o runs scenario s (on some path).
func (o *Options) has(s string) bool { return slices.Contains(o.Scenarios, s) }

// pmemBytes is the acceptor log size of the generated configs.
func (o *Options) pmemBytes() int64 {
	switch {
	case o.PMemMiB > 0:
		return int64(o.PMemMiB) << 20
	case o.has(scenLoad):
		return pmemLoadBytesDefault
	}
	return pmemBytesDefault
}

// loadStepDefault is the report step for a load of gib GiB: a row per
// GiB, or an eighth of a load below 2 GiB.
func loadStepDefault(gib float64) int {
	if gib >= 2 {
		return 1024
	}
	return max(1, int(gib*1024/8))
}

// Acceptor log sizes: the quick presets' 64 MiB, and kvnode's default
// (256 MiB) for the load scenario, which is about a store that holds
// real data.
const (
	pmemBytesDefault     = 64 << 20
	pmemLoadBytesDefault = 256 << 20
)

// loadTimeMaxDefault bounds the loading part of the load scenario (the
// follower's down time and catch-up come on top): 10 GiB at the issue's
// goal pace is minutes, and a machine that needs more than this has
// already answered the question.
const loadTimeMaxDefault = 4 * time.Hour
