package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/afxdp/netns"
	"synod/kv/proto"
	"synod/kv/server"
	"synod/tenants"
)

// slowBackend serves one request at a time, each taking service: a
// deliberately slow fake server.
type slowBackend struct {
	mu      sync.Mutex
	service time.Duration
}

func (b *slowBackend) Do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
	if req.Op == proto.OpStatus {
		return &proto.Response{Cluster: &proto.ClusterStatus{Self: 1, LeaderID: 1, Ballot: proto.Ballot{Round: 1, Node: 1}}}
	}
	b.mu.Lock()
	time.Sleep(b.service)
	b.mu.Unlock()
	if req.Op == proto.OpGet {
		return &proto.Response{Value: []byte("v"), HasValue: true}
	}
	return &proto.Response{}
}

// TestSlowServerLatencyReportedInFull drives kvbench's whole pipeline
// (clients, open-loop schedule, report) against a fake server that
// handles one request per 20 ms while 100/s are offered. The report must
// carry the backlog: the worst latency is at least offered*service - 1 s,
// which a closed-loop tool (latency from actual send) would not show.
func TestSlowServerLatencyReportedInFull(t *testing.T) {
	reg, err := tenants.NewRegistry([]tenants.Spec{{ID: 1, Name: "t", Token: "slow-token"}})
	if err != nil {
		t.Fatal(err)
	}
	be := &slowBackend{service: 20 * time.Millisecond}
	srv := server.New(server.Config{RequestTimeout: time.Minute}, reg, be, zerolog.Nop())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()

	o := tinyOptions()
	o.Tenants, o.Keys, o.Rate, o.Warmup, o.Duration = 2, 10, 100, 0, time.Second
	o.Scenarios = []string{"steady"}
	o.Endpoints, o.Token = []string{ln.Addr().String()}, "slow-token"
	o.OutDir = t.TempDir()
	o.NoPlots = true
	r, err := run(context.Background(), &o)
	if err != nil {
		t.Fatal(err)
	}
	p := r.Paths[0]
	if p.Status != "ok" {
		t.Fatalf("path %s: %s", p.Status, p.Reason)
	}
	st := p.Phases["steady"]
	if st.Offered < 60 || st.All.Count != st.Offered {
		t.Fatalf("offered %d, recorded %d", st.Offered, st.All.Count)
	}
	floor := time.Duration(st.Offered)*be.service - o.Duration
	if got := time.Duration(st.All.MaxUs) * time.Microsecond; got < floor*99/100 {
		t.Fatalf("max latency %v below the floor %v of a one-at-a-time server: the backlog was hidden", got, floor)
	}
	if got := time.Duration(st.All.P90Us) * time.Microsecond; got < floor/2 {
		t.Fatalf("p90 %v: the backlog (floor of the max %v) is missing from the tail", got, floor)
	}
}

// buildKvnode builds kvnode once for the smoke test.
func buildKvnode(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kvnode")
	cmd := exec.Command("go", "build", "-o", bin, "synod/cmd/kvnode")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("building kvnode: %v", err)
	}
	return bin
}

// TestSmokeEveryPathAndScenario runs every path and scenario at tiny
// scale on embedded clusters and checks the JSON holds every figure: the
// main paths that kvnode supports must run; a path kvnode cannot run yet
// must say why.
func TestSmokeEveryPathAndScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kvnode clusters")
	}
	o := tinyOptions()
	o.Scenarios = allScenarios // the load scenario too, at its tiny size
	o.Kvnode = buildKvnode(t)
	o.OutDir = t.TempDir()
	o.DataDir = t.TempDir()
	o.BasePort = 18100
	o.NodeProfiles = true
	r, err := run(context.Background(), &o)
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	writeTable(&table, r)
	t.Log("\n" + table.String())
	for _, row := range []string{"ceiling puts/s", "tail P99/P50", "overload tput % cap", "victim crit P99 quiet/flood",
		"load MB/s first/last step", "load catch-up s", "leader changes overload", "leader changes load"} {
		if !strings.Contains(table.String(), row) {
			t.Errorf("the table has no %q row", row)
		}
	}
	b, err := os.ReadFile(filepath.Join(o.OutDir, "kvbench.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("kvbench.json does not decode: %v", err)
	}
	if len(back.Paths) != len(allPaths()) {
		t.Fatalf("%d paths in the JSON, want %d", len(back.Paths), len(allPaths()))
	}
	for _, m := range missingFigures(&back, &o) {
		t.Error(m)
	}
	checkNodeProfiles(t, &back, &o)
	for _, f := range []string{"latency-write.png", "latency-read.png", "tenant-p99.png"} {
		if st, err := os.Stat(filepath.Join(o.OutDir, f)); err != nil || st.Size() == 0 {
			t.Errorf("plot %s: %v", f, err)
		}
	}
	t.Run("netns", func(t *testing.T) { checkNetnsPaths(t, &back) })
}

// checkNodeProfiles: every embedded paxos or raft cluster's tail and
// overload phases hold one CPU profile per node (gzip, as pprof writes
// them) and no node refused one.
func checkNodeProfiles(t *testing.T, r *Report, o *Options) {
	for _, p := range r.Paths {
		if p.Status != "ok" {
			continue
		}
		for _, s := range []string{scenTail, scenOverload} {
			ph := p.Phases[s]
			if ph == nil {
				continue
			}
			if len(ph.NodeProfiles) != o.Nodes || len(ph.NodeProfileErrors) != 0 {
				t.Errorf("%s/%s: profiles %v, refused %v; want %d", p.Name, s, ph.NodeProfiles, ph.NodeProfileErrors, o.Nodes)
				continue
			}
			for _, f := range ph.NodeProfiles {
				if b, err := os.ReadFile(f); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
					t.Errorf("%s/%s: %s is no pprof profile (%d bytes, %v)", p.Name, s, f, len(b), err)
				}
			}
		}
	}
}

// checkNetnsPaths: where namespaces can be built, paxos-udp-netns and
// paxos-afxdp must have run (their figures are checked with the rest by
// missingFigures), and AF_XDP must have carried consensus: the afxdp
// path's node namespaces count less than half the kernel UDP datagrams of
// the udp path's. Elsewhere it skips with the reason (fails under CI=true).
func checkNetnsPaths(t *testing.T, r *Report) {
	if err := netns.Available(); err != nil {
		skipOrFail(t, err)
	}
	byName := map[string]*PathResult{}
	for _, p := range r.Paths {
		byName[p.Name] = p
	}
	udp, xdp := byName["paxos-udp-netns"], byName["paxos-afxdp"]
	if udp == nil || xdp == nil {
		t.Fatal("the netns paths are missing from the report")
	}
	if udp.Status != "ok" {
		t.Fatalf("paxos-udp-netns: %s: %s", udp.Status, udp.Reason)
	}
	if xdp.Status != "ok" {
		if strings.Contains(xdp.Reason, "AF_XDP unavailable") {
			skipOrFail(t, errors.New(xdp.Reason))
		}
		t.Fatalf("paxos-afxdp: %s: %s", xdp.Status, xdp.Reason)
	}
	fmt.Printf("kvbench netns: kernel UDP datagrams paxos-udp-netns=%d paxos-afxdp=%d\n", udp.KernelUDPDatagrams, xdp.KernelUDPDatagrams)
	if udp.KernelUDPDatagrams == 0 || xdp.KernelUDPDatagrams*2 >= udp.KernelUDPDatagrams {
		t.Errorf("kernel UDP datagrams: udp path %d, afxdp path %d: AF_XDP did not bypass the kernel (or the count is broken)",
			udp.KernelUDPDatagrams, xdp.KernelUDPDatagrams)
	}
}

func skipOrFail(t *testing.T, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true but: %v", err)
	}
	t.Skipf("skipped: %v", err)
}

func TestFlagsValidate(t *testing.T) {
	for _, args := range [][]string{
		{"--dist", "pareto"}, {"--read-ratio", "1.5"}, {"--scenarios", "chaos"}, {"--paths", "nope"},
		{"--full", "--tiny"}, {"--endpoints", "127.0.0.1:1"}, {"extra"},
		{"--tail-share", "1.5"}, {"--overload-factor", "20"}, {"--load-gib", "5000"}, {"--ceiling-inflight", "100000"},
		{"--load-gib", "1", "--load-step-mib", "2048"}, {"--load-writers", "5000"}, {"--pmem-mib", "1000000"}, {"--load-time-max", "-1s"},
		{"--scenarios", "steady,loadd"},
	} {
		o, err := parseFlags(args)
		if err == nil {
			_, err = selectPaths(o)
		}
		if err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	o, err := parseFlags(nil)
	if err != nil || o.Tenants != 32 || o.ReadRatio != 0.7 || o.Nodes != 3 {
		t.Fatalf("defaults %+v %v", o, err)
	}
	if o.has(scenLoad) || !o.has(scenCeiling) || !o.has(scenTail) || !o.has(scenOverload) || o.pmemBytes() != 64<<20 {
		t.Fatalf("default scenarios %v, pmem %d: want every one but load, 64 MiB", o.Scenarios, o.pmemBytes())
	}
	if o.LoadGiB != 10 || o.LoadStepMiB != 1024 || o.LoadWriters != 16 || o.LoadDown != time.Minute || o.CeilingInflight != 256 ||
		o.TailShare != 0.5 || o.OverloadFactor != 1.5 {
		t.Fatalf("scenario defaults %+v", o)
	}
	o, err = parseFlags([]string{"--scenarios", "load", "--load-gib", "0.5"})
	if err != nil || o.LoadStepMiB != 64 || o.pmemBytes() != 256<<20 {
		t.Fatalf("--load-gib 0.5: step %d MiB, pmem %d, %v; want 64 MiB steps and kvnode's 256 MiB log", o.LoadStepMiB, o.pmemBytes(), err)
	}
}

// missingFigures lists every figure the report lacks: the machine, each
// path's durability, every phase's percentiles, throughput, per-tenant
// P99s, curves and CPU figures, interference and the headline. The main
// paths raft and paxos must have run; a path that did not says why.
func missingFigures(r *Report, o *Options) []string {
	var out []string
	add := func(f string, a ...any) { out = append(out, fmt.Sprintf(f, a...)) }
	if r.Machine.CPUs == 0 || r.Machine.GoVersion == "" || r.Machine.CPUModel == "" {
		add("machine description incomplete: %+v", r.Machine)
	}
	for _, p := range r.Paths {
		if p.Durability == "" {
			add("%s: no durability mode", p.Name)
		}
		if p.Status != "ok" {
			// resp needs redis-benchmark, which CI installs (scripts/test.sh);
			// it has one tenant (redis-benchmark's), so no per-tenant P99s.
			if p.Name == "raft" || p.Name == "paxos" || (p.Name == "resp" && os.Getenv("CI") == "true") {
				add("main path %s: %s: %s", p.Name, p.Status, p.Reason)
			}
			if p.Reason == "" {
				add("%s is %s without a reason", p.Name, p.Status)
			}
			continue
		}
		// The JSON drops a path's unexported fields (main, resp, ...):
		// take them from the path of that name.
		path := p.Path
		for _, known := range allPaths() {
			if known.Name == p.Name {
				path = known
			}
		}
		for _, s := range scenariosFor(o, path) {
			ph := p.Phases[s]
			if ph == nil {
				add("%s: no %s phase", p.Name, s)
				continue
			}
			if !path.resp && len(o.Endpoints) == 0 {
				// Every embedded phase read the nodes' /metrics.
				if ph.Cluster == nil || ph.Cluster.LeaderChangesMetric < 0 || len(ph.Cluster.Nodes) != o.Nodes {
					add("%s/%s: no leader-change count from the nodes' metrics: %+v", p.Name, s, ph.Cluster)
				}
			}
			if runtime.GOOS == "linux" && ph.HostStealPct == nil {
				add("%s/%s: no host steal figure (/proc/stat)", p.Name, s)
			}
			if s == scenCeiling || s == scenTail || s == scenOverload || s == scenLoad {
				out = append(out, missingScenarioFigures(p, s, ph, o)...)
				continue
			}
			if ph.Read.Count == 0 || ph.Write.Count == 0 || ph.Read.P99Us == 0 || ph.Write.P999Us == 0 ||
				ph.Victim.P99Us == 0 || ph.ThroughputOps == 0 || (len(ph.TenantP99Us) != o.Tenants && p.Name != "resp") ||
				len(ph.ReadCurve) == 0 || len(ph.WriteCurve) == 0 || ph.CPUSeconds <= 0 || ph.CPUPer1000 <= 0 {
				add("%s/%s: missing figures: %+v", p.Name, s, ph)
			}
			if s == "noisy" && ph.BulkScan.Count+ph.BulkWrite.Count == 0 {
				add("%s: the noisy tenant sent nothing", p.Name)
			}
			if s == "hog" && ph.HogNote == "" {
				add("%s: hog phase without a note", p.Name)
			}
		}
		if p.Base == "" && o.has(scenNoisy) && (p.VictimP99SteadyUs == 0 || p.VictimP99NoisyUs == 0 || p.InterferenceRatio == 0) {
			add("%s: interference figures missing", p.Name)
		}
	}
	if r.Headline.Against == "" || r.Headline.WriteP99Ratio == 0 || len(r.Headline.InterferenceRatio) == 0 {
		add("headline incomplete: %+v", r.Headline)
	}
	return out
}

// TestMissingFiguresCatchesGaps plants gaps in a complete report and
// shows the completeness check reports each.
func TestMissingFiguresCatchesGaps(t *testing.T) {
	o := tinyOptions()
	o.Scenarios = allScenarios
	full := func() *Report {
		r := &Report{Machine: Machine{CPUs: 2, GoVersion: "go", CPUModel: "cpu"},
			Headline: Headline{Against: "paxos", WriteP99Ratio: 1, InterferenceRatio: map[string]float64{"raft": 1}}}
		for _, p := range allPaths()[:2] {
			pr := &PathResult{Path: p, Status: "ok", Phases: map[string]*PhaseResult{},
				VictimP99SteadyUs: 1, VictimP99NoisyUs: 1, InterferenceRatio: 1}
			for _, s := range o.Scenarios {
				pr.Phases[s] = completePhase(s, &o)
			}
			r.Paths = append(r.Paths, pr)
		}
		return r
	}
	if m := missingFigures(full(), &o); len(m) != 0 {
		t.Fatalf("a complete report flagged: %v", m)
	}
	for name, plant := range map[string]func(r *Report){
		"write p99.9":           func(r *Report) { r.Paths[0].Phases["steady"].Write.P999Us = 0 },
		"noisy phase":           func(r *Report) { delete(r.Paths[1].Phases, "noisy") },
		"tenant p99s":           func(r *Report) { r.Paths[0].Phases["hog"].TenantP99Us = nil },
		"cpu figure":            func(r *Report) { r.Paths[1].Phases["steady"].CPUPer1000 = 0 },
		"durability":            func(r *Report) { r.Paths[0].Durability = "" },
		"main path n/a":         func(r *Report) { r.Paths[0].Status, r.Paths[0].Reason = "n/a", "x" },
		"interference":          func(r *Report) { r.Paths[1].InterferenceRatio = 0 },
		"headline":              func(r *Report) { r.Headline.WriteP99Ratio = 0 },
		"machine":               func(r *Report) { r.Machine.CPUModel = "" },
		"leader-change metric":  func(r *Report) { r.Paths[0].Phases["noisy"].Cluster.LeaderChangesMetric = -1 },
		"no cluster window":     func(r *Report) { r.Paths[1].Phases["tail"].Cluster = nil },
		"ceiling phase":         func(r *Report) { delete(r.Paths[0].Phases, scenCeiling) },
		"ceiling figures":       func(r *Report) { r.Paths[0].Phases[scenCeiling].Ceiling = nil },
		"ceiling throughput":    func(r *Report) { r.Paths[1].Phases[scenCeiling].ThroughputOps = 0 },
		"tail offered":          func(r *Report) { r.Paths[0].Phases[scenTail].Tail.OfferedOps *= 2 },
		"tail ratio below 1":    func(r *Report) { r.Paths[1].Phases[scenTail].Tail.P99OverP50 = 0.5 },
		"tail p99.9":            func(r *Report) { r.Paths[0].Phases[scenTail].Write.P999Us = 0 },
		"tail in store":         func(r *Report) { r.Paths[1].Phases[scenTail].Tail.Store = nil },
		"raft tail in store":    func(r *Report) { r.Paths[0].Phases[scenTail].Tail.Store = nil },
		"tail in-store ratio":   func(r *Report) { r.Paths[1].Phases[scenTail].Tail.StoreP99OverP50 = 0.5 },
		"overload figures":      func(r *Report) { r.Paths[0].Phases[scenOverload].Overload = nil },
		"overload share":        func(r *Report) { r.Paths[1].Phases[scenOverload].Overload.ShareOfCapacity = 2 },
		"overload victim":       func(r *Report) { r.Paths[0].Phases[scenOverload].Overload.Victims[1].Quiet.Count = 0 },
		"overload one victim":   func(r *Report) { o := r.Paths[0].Phases[scenOverload].Overload; o.Victims = o.Victims[:1] },
		"overload paxos shed":   func(r *Report) { r.Paths[1].Phases[scenOverload].Overload.ShedByClass = nil },
		"overload flood rate":   func(r *Report) { r.Paths[1].Phases[scenOverload].Overload.FloodOfferedOps = 1 },
		"overload victims in":   func(r *Report) { r.Paths[0].Phases[scenOverload].Overload.VictimsIn = "" },
		"load figures":          func(r *Report) { r.Paths[0].Phases[scenLoad].Load = nil },
		"load stalled":          func(r *Report) { r.Paths[1].Phases[scenLoad].Load.Stalled = true },
		"load cut off":          func(r *Report) { r.Paths[0].Phases[scenLoad].Load.CutOff = true },
		"load short":            func(r *Report) { r.Paths[1].Phases[scenLoad].Load.LoadedBytes /= 2 },
		"load step row":         func(r *Report) { l := r.Paths[0].Phases[scenLoad].Load; l.Steps = l.Steps[1:] },
		"load step rss":         func(r *Report) { r.Paths[0].Phases[scenLoad].Load.Steps[0].Nodes = nil },
		"load end disk":         func(r *Report) { r.Paths[0].Phases[scenLoad].Load.End = []NodeSample{{RSSBytes: 1, DataBytes: -1}} },
		"load no restart":       func(r *Report) { r.Paths[1].Phases[scenLoad].Load.Restart = nil },
		"load not caught up":    func(r *Report) { r.Paths[0].Phases[scenLoad].Load.Restart.CatchUpSeconds = -1 },
		"load no commit target": func(r *Report) { r.Paths[0].Phases[scenLoad].Load.Restart.LeaderCommitAtRestart = 0 },
		"load leader is victim": func(r *Report) { l := r.Paths[1].Phases[scenLoad].Load.Restart; l.LeaderAtRestart = l.Node },
		"load slowdown":         func(r *Report) { r.Paths[1].Phases[scenLoad].Load.Slowdown = 0 },
		"host steal":            func(r *Report) { r.Paths[0].Phases[scenTail].HostStealPct = nil },
	} {
		if name == "host steal" && runtime.GOOS != "linux" {
			continue // measured from /proc/stat, on Linux only
		}
		r := full()
		plant(r)
		if len(missingFigures(r, &o)) == 0 {
			t.Errorf("planted gap %q not caught", name)
		}
	}
}
