package rtl

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"synod/accel"
)

var (
	cosimSeed        = flag.Uint64("cosim.seed", 1, "seed of the co-simulation workloads (cluster and random)")
	cosimEvents      = flag.Int("cosim.events", 1_000_000, "input events the co-simulation replays at least")
	cosimReplicaRuns = flag.Int("cosim.replica-runs", 3, "runs of kv/replica's accel cluster tests whose traces the co-simulation replays (0: leave the runtime source out)")
)

// cosimSpec is DefaultSpec's sizing (4096-slot window, 5 replicas, 32
// tenants: the build the RTL is sized for) with timer periods short enough
// that a trace of a few seconds of plane time sees many heartbeats, lease
// changes and election timeouts.
func cosimSpec() accel.Spec {
	s := accel.DefaultSpec()
	s.HeartbeatPeriodTicks = 2_000
	s.LeaseTicks = 10_000
	s.LeaseDriftTicks = 1_000
	s.ElectionTicks = 15_000
	s.ElectionJitterTicks = 4_096
	s.Seed = 7
	return s
}

// replayAll replays each trace through the RTL and compares, summing the
// results.
func replayAll(t *testing.T, b cosimBuild, traces []string) compareResult {
	t.Helper()
	var sum compareResult
	for _, tr := range traces {
		rtlTrace := runCosim(t, b, tr)
		res, err := compareTraces(tr, rtlTrace)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(tr), err)
		}
		for i := range res.First {
			res.First[i] = filepath.Base(tr) + ": " + res.First[i]
		}
		sum.add(res)
		os.Remove(rtlTrace)
	}
	return sum
}

// cosimRequired are outputs every full co-simulation run must have
// compared at least once: each engine's success path and its main hand-ups.
var cosimRequired = []string{
	"COMMIT", "SEND-ACCEPTED", "MIRROR", "HEARTBEAT", "HEARTBEAT-ACK", "LEASE-GAINED", "LEASE-LOST",
	"ELECTION-TIMEOUT", "ADMIT/ok=0", "ADMIT/ok=1",
	"HANDUP/arm/reason=2", "HANDUP/accepted/reason=2", "HANDUP/accepted/reason=3", "HANDUP/accepted/reason=4",
	"HANDUP/accepted/reason=6", "HANDUP/accept/reason=2", "HANDUP/accept/reason=5", "HANDUP/accept/reason=7",
	"HANDUP/heartbeat/reason=5", "HANDUP/heartbeat/reason=11", "HANDUP/heartbeat-ack/reason=4",
	"HANDUP/heartbeat-ack/reason=10", "HANDUP/admit/reason=8",
}

// TestCosim replays traces recorded from the Go accel model through the
// Verilated RTL and compares every output event, exactly:
//   - paxos-group: planes beside real paxos.Nodes (accel's group test,
//     3 and 5 nodes, 4 seeds), one trace per plane;
//   - replica:  planes driven by the replica runtime (kv/replica's accel
//     cluster tests: real Replicas, writes, leader changes, restart,
//     stall, partition), one trace per plane per start;
//   - cluster5: a synthetic 5-node cluster (quorum 3), one trace per node;
//   - cluster3: a 3-node cluster (quorum 2) on the same 5-entry hardware;
//   - random:   seed-driven random stimulus over every input kind.
//
// The synthetic sources alone give at least -cosim.events inputs
// (1,000,000 by default); the paxos and replica traces come on top.
func TestCosim(t *testing.T) {
	needTool(t, "verilator")
	spec := cosimSpec()
	dir := t.TempDir()
	seed := *cosimSeed
	// Input events per step of each cluster, measured: ~38 for 5 nodes,
	// ~22 for 3. The shares below give ~60% cluster5, ~20% cluster3, ~20%
	// random; a short count is topped up with more random stimulus.
	target := *cosimEvents
	c5 := clusterConfig{Name: "cluster5", Nodes: 5, Quorum: 3, Steps: target * 6 / 10 / 38, Seed: seed,
		DropPct: 2, DupPct: 2, WALFail: 300, Tenants: 6, Proposes: 6}
	c3 := clusterConfig{Name: "cluster3", Nodes: 3, Quorum: 2, Steps: target * 2 / 10 / 22, Seed: seed + 1,
		DropPct: 5, DupPct: 3, WALFail: 100, Tenants: 3, Proposes: 4}
	var res compareResult
	var rp compareResult
	for _, tr := range paxosTraces(t) {
		rp.add(replayAll(t, buildFor(traceSpec(t, tr)), []string{tr}))
		os.Remove(tr)
	}
	res.add(rp)
	var rq compareResult
	var replicaSpecs []string
	if *cosimReplicaRuns > 0 {
		for _, tr := range replicaTraces(t, *cosimReplicaRuns) {
			s := traceSpec(t, tr)
			replicaSpecs = appendOnce(replicaSpecs, fmt.Sprintf("W%d/R%d/T%d", s.WindowSlots, s.Replicas, s.TenantsMax))
			rq.add(replayAll(t, buildFor(s), []string{tr}))
			os.Remove(tr)
		}
	}
	res.add(rq)
	r5 := replayAll(t, buildFor(spec), clusterTraces(t, spec, c5, dir))
	res.add(r5)
	r3 := replayAll(t, buildFor(spec), clusterTraces(t, spec, c3, dir))
	res.add(r3)
	var rr compareResult
	seeds := 0
	synthetic := r5.Inputs + r3.Inputs
	for i := uint64(0); synthetic+rr.Inputs < uint64(target); i++ {
		tr := filepath.Join(dir, fmt.Sprintf("random-seed%d.trace", seed+i))
		n := max(uint64(target)-synthetic-rr.Inputs, 50_000)
		randomTrace(t, spec, seed+i, int(min(n, 250_000)), tr)
		rr.add(replayAll(t, buildFor(spec), []string{tr}))
		os.Remove(tr)
		seeds++
	}
	res.add(rr)
	replica := "off"
	if *cosimReplicaRuns > 0 {
		replica = fmt.Sprintf("%d", rq.Inputs)
	}
	fmt.Printf("cosim: events=%d mismatches=%d outputs=%d sources=paxos-group(accel %s: 3+5 paxos.Nodes x 4 seeds, W256):%d,replica(kv/replica accel cluster tests x %d runs: 3 Replicas, %s):%s,cluster5(seed=%d):%d,cluster3(seed=%d):%d,random(seeds %d..%d):%d\n",
		res.Inputs, res.Mismatches, res.Outputs, paxosGroupTest, rp.Inputs, *cosimReplicaRuns, strings.Join(replicaSpecs, "+"), replica,
		c5.Seed, r5.Inputs, c3.Seed, r3.Inputs, seed, seed+uint64(max(seeds, 1))-1, rr.Inputs)
	if testing.Verbose() {
		printCoverage(os.Stdout, res.Coverage)
	}
	if res.Mismatches != 0 {
		t.Errorf("%d inputs with mismatched outputs; first:\n%s", res.Mismatches, strings.Join(res.First, "\n"))
	}
	if res.Inputs < uint64(target) {
		t.Errorf("replayed %d input events, want >= %d", res.Inputs, target)
	}
	for _, k := range cosimRequired {
		if res.Coverage[k] == 0 {
			t.Errorf("no %s output was compared: the workloads lost coverage", k)
		}
	}
}

// appendOnce appends s to list unless it is there already.
func appendOnce(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

func printCoverage(w io.Writer, cov map[string]uint64) {
	keys := make([]string, 0, len(cov))
	for k := range cov {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %-36s %d\n", k, cov[k])
	}
}

// TestCosimPlantedQuorumBug shows the co-simulation catches a divergence:
// the RTL built with PLANT_QUORUM_OFF_BY_ONE commits one ack early, and the
// comparison must report mismatches on an ordinary cluster trace.
func TestCosimPlantedQuorumBug(t *testing.T) {
	needTool(t, "verilator")
	spec := cosimSpec()
	traces := clusterTraces(t, spec, clusterConfig{Name: "planted", Nodes: 5, Quorum: 3, Steps: 2000,
		Seed: *cosimSeed, DropPct: 2, DupPct: 2, Tenants: 2, Proposes: 4}, t.TempDir())
	good := replayAll(t, buildFor(spec), traces)
	if good.Mismatches != 0 {
		t.Fatalf("the correct RTL mismatched: %s", strings.Join(good.First, "\n"))
	}
	b := buildFor(spec)
	b.PlantQuorumOffByOne = true
	bad := replayAll(t, b, traces)
	fmt.Printf("cosim planted quorum-off-by-one: events=%d mismatches=%d (correct RTL: 0)\n", bad.Inputs, bad.Mismatches)
	if bad.Mismatches == 0 {
		t.Fatal("the RTL with quorum off by one matched the model: the comparison cannot see divergence")
	}
	if !strings.Contains(strings.Join(bad.First, "\n"), "COMMIT") {
		t.Errorf("mismatches do not involve a commit: %s", strings.Join(bad.First, "\n"))
	}
}

// TestCompareMutatedTrace shows the comparison itself fails on a trace
// whose recorded outputs were altered (one commit dropped, one hand-up
// reason changed), without needing a second RTL build.
func TestCompareMutatedTrace(t *testing.T) {
	needTool(t, "verilator")
	spec := cosimSpec()
	dir := t.TempDir()
	tr := filepath.Join(dir, "random.trace")
	randomTrace(t, spec, *cosimSeed, 20_000, tr)
	rtlTrace := runCosim(t, buildFor(spec), tr)
	if res, err := compareTraces(tr, rtlTrace); err != nil || res.Mismatches != 0 {
		t.Fatalf("unmutated trace: %+v %v", res, err)
	}
	f, err := os.Open(tr)
	if err != nil {
		t.Fatal(err)
	}
	gotSpec, evs, err := accel.ReadTrace(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	dropped, changed := false, false
	mut := evs[:0:0]
	for _, e := range evs {
		switch {
		case !dropped && e.Kind == accel.OutCommit:
			dropped = true
			continue
		case dropped && !changed && e.Kind == accel.OutHandUp:
			e.Flags ^= 1
			changed = true
		}
		mut = append(mut, e)
	}
	if !dropped || !changed {
		t.Fatal("trace has no commit or hand-up to mutate")
	}
	mutPath := filepath.Join(dir, "mutated.trace")
	mf, err := os.Create(mutPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := accel.WriteTrace(mf, gotSpec, mut); err != nil {
		t.Fatal(err)
	}
	mf.Close()
	res, err := compareTraces(mutPath, rtlTrace)
	if err != nil {
		t.Fatal(err)
	}
	if res.Mismatches != 2 {
		t.Fatalf("mutated trace: %d mismatches, want 2 (%v)", res.Mismatches, res.First)
	}
}
