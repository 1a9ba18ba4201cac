package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"synod/kv/replica"
)

// TestStageOrderMatchesReplica holds kvbench's stage names equal to the
// ones the replica exports, in path order.
func TestStageOrderMatchesReplica(t *testing.T) {
	if !slices.Equal(writeStageOrder, replica.WriteStages[:]) {
		t.Errorf("write stages %v, the replica's %v", writeStageOrder, replica.WriteStages)
	}
	if !slices.Equal(readStageOrder, replica.ReadStages[:]) {
		t.Errorf("read stages %v, the replica's %v", readStageOrder, replica.ReadStages)
	}
	for _, st := range followerStages {
		if !slices.Contains(writeStageOrder, st) {
			t.Errorf("follower stage %q is no write stage", st)
		}
	}
}

// histText renders a stage histogram's cumulative buckets as a scrape.
func histText(m metrics, name, stage string, les []float64, counts []float64) {
	for i, le := range les {
		l := fmt.Sprint(le)
		if math.IsInf(le, 1) {
			l = "+Inf"
		}
		m[fmt.Sprintf(`%s_bucket{stage=%q,le=%q}`, name, stage, l)] = counts[i]
	}
}

// TestQuantileInterpolates checks the quantiles against hand-computed
// values, the +Inf bucket and an empty histogram.
func TestQuantileInterpolates(t *testing.T) {
	inf := math.Inf(1)
	bs := []bucket{{0.001, 50}, {0.002, 90}, {0.004, 99}, {0.008, 100}, {inf, 100}}
	for _, c := range []struct {
		q    float64
		want float64
	}{{0.5, 0.001}, {0.25, 0.0005}, {0.7, 0.0015}, {0.99, 0.004}, {0.995, 0.006}} {
		got, over := quantile(bs, c.q)
		if over || math.Abs(got-c.want) > 1e-12 {
			t.Errorf("q%v = %v (over %v), want %v", c.q, got, over, c.want)
		}
	}
	bs = []bucket{{0.001, 10}, {0.002, 10}, {inf, 20}}
	if got, over := quantile(bs, 0.9); !over || got != 0.002 {
		t.Errorf("q0.9 in +Inf = %v over %v, want the top bound 0.002 and over", got, over)
	}
	if got, over := quantile(nil, 0.5); got != 0 || over {
		t.Errorf("empty: %v %v", got, over)
	}
	f := figuresOf("apply", bs)
	if f.Count != 20 || !f.Over || f.MaxMs != -1 {
		t.Errorf("figures %+v: want count 20, over, max -1 (above the top bucket)", f)
	}
}

// TestStagesOf computes a window from three nodes' scrapes: the leader is
// the node that proposed, its stages are differences over the window, the
// followers' stages are summed, stalls are counted by path and stage, and
// a node whose counters went back (a restart) is left out.
func TestStagesOf(t *testing.T) {
	les := []float64{0.001, 0.01, 0.1, math.Inf(1)}
	mk := func() metrics { return metrics{} }
	start := []metrics{mk(), mk(), mk()}
	end := []metrics{mk(), mk(), mk()}
	for k := range 3 {
		for _, st := range writeStageOrder {
			histText(start[k], metricWriteStage, st, les, []float64{0, 0, 0, 0})
			histText(end[k], metricWriteStage, st, les, []float64{0, 0, 0, 0})
		}
	}
	// Node 2 leads: 100 writes proposed in the window, 10 of them slow.
	histText(start[1], metricWriteStage, "propose_queue", les, []float64{5, 5, 5, 5})
	histText(end[1], metricWriteStage, "propose_queue", les, []float64{95, 95, 105, 105})
	histText(end[1], metricWriteStage, "persist", les, []float64{50, 100, 100, 100})
	// Node 1 proposed 2 (a forwarded write): not the leader.
	histText(end[0], metricWriteStage, "propose_queue", les, []float64{2, 2, 2, 2})
	// The followers persist: node 1 60 fast, node 3 restarted (its
	// counts went back), so it is left out.
	histText(end[0], metricWriteStage, "persist", les, []float64{60, 60, 60, 60})
	histText(start[2], metricWriteStage, "persist", les, []float64{500, 500, 500, 500})
	histText(end[2], metricWriteStage, "persist", les, []float64{7, 7, 7, 7})
	// Stalls: node 2's apply twice, node 1's persist once (3 before the
	// window); traces written by node 2: 1.
	start[0][`synod_stage_stalls_total{path="write",stage="persist"}`] = 3
	end[0][`synod_stage_stalls_total{path="write",stage="persist"}`] = 4
	start[1][`synod_stage_stalls_total{path="write",stage="apply"}`] = 0
	end[1][`synod_stage_stalls_total{path="write",stage="apply"}`] = 2
	end[1][`synod_stage_stalls_total{path="read",stage="apply_wait"}`] = 0
	start[1][`synod_stall_traces_total{result="written"}`] = 1
	end[1][`synod_stall_traces_total{result="written"}`] = 2

	sw := stagesOf(start, end, nil)
	if sw.Leader != 2 {
		t.Fatalf("leader %d, want 2", sw.Leader)
	}
	pq := stageOf(sw.Write, "propose_queue")
	if pq == nil || pq.Count != 100 || pq.P50Ms > 1 || pq.P99Ms <= 10 {
		t.Errorf("propose_queue %+v: want 100 writes, P50 <= 1 ms, P99 in (10, 100] ms", pq)
	}
	if p := stageOf(sw.Followers, "persist"); p == nil || p.Count != 60 {
		t.Errorf("followers' persist %+v: want node 1's 60 only (node 3 restarted)", p)
	}
	if sw.StallsTotal != 3 || sw.Stalls["write/apply"] != 2 || sw.Stalls["write/persist"] != 1 || len(sw.Stalls) != 2 {
		t.Errorf("stalls %v total %d: want write/apply 2, write/persist 1", sw.Stalls, sw.StallsTotal)
	}
	if sw.TracesWritten != 1 {
		t.Errorf("traces written %d, want 1", sw.TracesWritten)
	}

	// Nodes without the stall counter: -1, not 0.
	if sw := stagesOf([]metrics{mk()}, []metrics{mk()}, nil); sw.StallsTotal != -1 || sw.Leader != 0 {
		t.Errorf("no series: %+v", sw)
	}
}

// TestSeriesLabelsRefusesMalformed feeds series keys kvbench did not
// make: each is an error, none a panic.
func TestSeriesLabelsRefusesMalformed(t *testing.T) {
	name, labels, err := seriesLabels(`x_bucket{stage="a\"b",le="0.5"}`)
	if err != nil || name != "x_bucket" || labels["stage"] != `a"b` || labels["le"] != "0.5" {
		t.Fatalf("%q %v %v", name, labels, err)
	}
	for _, s := range []string{`x{`, `x{stage}`, `x{stage=}`, `x{stage="a}`, `x{="a"}`, `x{stage=a}`, `x{stage="\`} {
		if _, _, err := seriesLabels(s); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
}

// TestStallConfigRendersTable checks the [stall] table kvbench gives its
// nodes: threshold only when set, trace off unless asked, the directory
// under --out.
func TestStallConfigRendersTable(t *testing.T) {
	o := &Options{OutDir: t.TempDir()}
	p := Path{Name: "shm"}
	s := stallConfig(o, p, 2)
	if strings.Contains(s, "threshold") || !strings.Contains(s, "trace = false") || !strings.Contains(s, "node2") {
		t.Errorf("default table:\n%s", s)
	}
	o.StallThreshold, o.StallTrace = 5e6, true
	s = stallConfig(o, p, 1)
	if !strings.Contains(s, `threshold = "5ms"`) || !strings.Contains(s, "trace = true") {
		t.Errorf("threshold 5ms, trace on:\n%s", s)
	}
}

// setTenantBuckets sets tenant's synod_tenant_latency_seconds buckets of
// stage in m: counts[i] at les[i] (nil: 5,000 in every bucket, a series
// the figures must not count).
func setTenantBuckets(m metrics, tenant, stage string, les, counts []float64) {
	for i, le := range les {
		l := fmt.Sprint(le)
		if math.IsInf(le, 1) {
			l = "+Inf"
		}
		n := 5000.0
		if counts != nil {
			n = counts[i]
		}
		m[fmt.Sprintf(`%s_bucket{tenant=%q,stage=%q,le=%q}`, tenantServiceMetric, tenant, stage, l)] = n
	}
}

// TestStoreVictimWindows: a victim's store-side figures come from its
// own tenant's service series only, as deltas between the scrapes, summed
// over the nodes; a node missing from a scrape gives no figures.
func TestStoreVictimWindows(t *testing.T) {
	inf := math.Inf(1)
	les := []float64{0.001, 0.002, 0.004, 0.008, inf}
	scrape := func(victim, other [][]float64) []metrics {
		var out []metrics
		for k := range victim {
			m := metrics{}
			setTenantBuckets(m, "v", "service", les, victim[k])
			setTenantBuckets(m, "v", "queue", les, nil)
			setTenantBuckets(m, "flood", "service", les, other[k])
			out = append(out, m)
		}
		return out
	}
	zero := []float64{0, 0, 0, 0, 0}
	s0 := scrape([][]float64{zero, zero}, [][]float64{zero, zero})
	// Quiet: 100 requests on node 1, every one under 1 ms.
	s1 := scrape([][]float64{{100, 100, 100, 100, 100}, zero}, [][]float64{zero, zero})
	// Flood: node 1 adds 100 more, 10 of them 4-8 ms; the flood's own
	// series (all slow) must not count.
	s2 := scrape([][]float64{{190, 190, 190, 200, 200}, zero}, [][]float64{{0, 0, 0, 0, 5000}, zero})
	sv := storeVictim("v", s0, s1, s2)
	if sv == nil {
		t.Fatal("no figures")
	}
	if sv.QuietCount != 100 || sv.FloodCount != 100 {
		t.Fatalf("counts %d/%d, want 100/100", sv.QuietCount, sv.FloodCount)
	}
	if sv.QuietP99Ms > 1 || sv.FloodP99Ms < 4 || sv.FloodP99Ms > 8 || sv.Ratio < 4 {
		t.Fatalf("quiet p99 %.3f ms, flood p99 %.3f ms, ratio %.2f", sv.QuietP99Ms, sv.FloodP99Ms, sv.Ratio)
	}
	if sv.OverTopBound {
		t.Fatal("over the top bound")
	}
	s2[1] = nil
	if storeVictim("v", s0, s1, s2) != nil {
		t.Fatal("figures with a node missing from a scrape")
	}
}

// TestTailStoreFigures: the tail's in-store figures are the load tenant's
// service series alone (another tenant's, and the queue stage, are not
// counted), summed over the nodes as deltas across the window, with
// ratios that follow from them; a window without the tenant gives none.
func TestTailStoreFigures(t *testing.T) {
	inf := math.Inf(1)
	les := []float64{0.001, 0.002, 0.004, 0.008, 0.016, inf}
	scrape := func(load [][]float64) []metrics {
		var out []metrics
		for k := range load {
			m := metrics{}
			setTenantBuckets(m, loadTenantName, "service", les, load[k])
			setTenantBuckets(m, loadTenantName, "queue", les, nil)
			setTenantBuckets(m, "other", "service", les, nil)
			out = append(out, m)
		}
		return out
	}
	zero := []float64{0, 0, 0, 0, 0, 0}
	start := scrape([][]float64{{50, 50, 50, 50, 50, 50}, zero})
	// 1,000 writes on the leader: 980 under 1 ms, 10 in 8-16 ms, 10 over.
	end := scrape([][]float64{{1030, 1030, 1030, 1030, 1040, 1050}, {0, 0, 0, 0, 0, 0}})
	f, ok := tenantService(loadTenantName, start, end)
	if !ok || f.Count != 1000 {
		t.Fatalf("count %d ok %v, want 1000", f.Count, ok)
	}
	var tl TailResult
	tl.setStore(&f)
	if tl.Store == nil || tl.Store.P50Ms > 1 || tl.Store.P99Ms < 8 || tl.Store.P99Ms > 16 || !tl.Store.Over {
		t.Fatalf("in-store figures %+v", tl.Store)
	}
	if math.Abs(tl.StoreP99OverP50-tl.Store.P99Ms/tl.Store.P50Ms) > 1e-9 || tl.StoreP999OverP50 < tl.StoreP99OverP50 {
		t.Fatalf("ratios %v, %v from %+v", tl.StoreP99OverP50, tl.StoreP999OverP50, tl.Store)
	}
	if _, ok := tenantService("nobody", start, end); ok {
		t.Fatal("figures for a tenant with no series")
	}
	var none TailResult
	none.setStore(&StageFigures{})
	if none.Store != nil {
		t.Fatal("an empty window recorded as in-store figures")
	}
}
