package main

import (
	"errors"
	"fmt"
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

	Paths     []string // which paths to run ("" = all)
	Scenarios []string // steady, noisy, hog
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
)

// quickOptions scales the reference workload (5 nodes RF 3, 32 tenants,
// 70/30, one noisy tenant) to a 2-core machine and about a minute for
// the main paths: 3 replicas (RF 3), short phases.
func quickOptions() Options {
	return Options{
		Nodes: 3, Tenants: 32, ReadRatio: 0.7, Keys: 1000, Dist: "zipf", ZipfS: 1.1, ValueBytes: 128,
		Rate: 1000, Warmup: 1 * time.Second, Duration: 3 * time.Second, Settle: 2 * time.Second, Concurrency: 1024, Seed: 1,
		NoisyPeriod: 200 * time.Millisecond, NoisyBurst: 32, ScanLimit: 1000, BatchOps: 64, ContractFactor: 4,
		HogCPUs: 1, Scenarios: []string{"steady", "noisy", "hog"}, OutDir: "out/kvbench", BasePort: 17000,
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
	}
	for _, s := range o.Scenarios {
		if s != "steady" && s != "noisy" && s != "hog" {
			return fmt.Errorf("--scenarios: %q is not steady, noisy or hog", s)
		}
	}
	return nil
}
