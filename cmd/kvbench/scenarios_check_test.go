package main

import (
	"fmt"
	"math"

	"synod/bench/hist"
)

// missingScenarioFigures lists what a ceiling, tail, overload or load
// phase lacks, or holds that cannot be (sanity, not goals: a tail ratio
// below 1 is a broken figure, a ratio of 50 is a measurement).
func missingScenarioFigures(p *PathResult, s string, ph *PhaseResult, o *Options) []string {
	var out []string
	add := func(f string, a ...any) { out = append(out, fmt.Sprintf("%s/%s: ", p.Name, s)+fmt.Sprintf(f, a...)) }
	near := func(a, b float64) bool { return math.Abs(a-b) <= 0.01*math.Max(math.Abs(a), math.Abs(b)) }
	switch s {
	case scenCeiling:
		c := ph.Ceiling
		switch {
		case c == nil:
			add("no ceiling figures")
		case ph.ThroughputOps <= 0 || c.PutsPerSec != ph.ThroughputOps || c.Inflight != o.CeilingInflight || c.Clients < 1:
			add("capacity %+v, throughput %v", c, ph.ThroughputOps)
		case ph.Write.Count == 0 || ph.Write.P50Us == 0 || ph.Write.P99Us < ph.Write.P50Us || ph.CPUSeconds <= 0:
			add("latency or CPU missing: %+v cpu %v", ph.Write, ph.CPUSeconds)
		}
	case scenTail:
		tl := ph.Tail
		switch {
		case tl == nil:
			add("no tail figures")
		case tl.CapacityOps <= 0 || tl.CapacitySource == "" || !near(tl.OfferedOps, tl.Share*tl.CapacityOps) || tl.Share != o.TailShare:
			add("offered %v is not %v of capacity %v (%q)", tl.OfferedOps, tl.Share, tl.CapacityOps, tl.CapacitySource)
		case ph.Write.Count == 0 || ph.Write.P50Us == 0 || ph.Write.P999Us == 0 || ph.ThroughputOps <= 0:
			add("write figures missing: %+v, throughput %v", ph.Write, ph.ThroughputOps)
		case tl.P99OverP50 < 1 || tl.P999OverP50 < tl.P99OverP50 ||
			!near(tl.P99OverP50, float64(ph.Write.P99Us)/float64(ph.Write.P50Us)):
			add("ratios %v, %v do not follow from %+v", tl.P99OverP50, tl.P999OverP50, ph.Write)
		}
		// Both backends time every request inside the node
		// (synod_tenant_latency_seconds).
		if tl != nil && len(o.Endpoints) == 0 {
			switch st := tl.Store; {
			case st == nil:
				add("no in-store figures (%s's service time)", loadTenantName)
			case st.P50Ms <= 0 || st.P99Ms < st.P50Ms || st.P999Ms < st.P99Ms ||
				!near(tl.StoreP99OverP50, st.P99Ms/st.P50Ms) || !near(tl.StoreP999OverP50, st.P999Ms/st.P50Ms):
				add("in-store figures %+v, ratios %v, %v", *st, tl.StoreP99OverP50, tl.StoreP999OverP50)
			}
		}
	case scenOverload:
		or := ph.Overload
		if or == nil {
			add("no overload figures")
			break
		}
		if or.CapacityOps <= 0 || !near(or.FloodOfferedOps, or.Factor*or.CapacityOps) || or.Factor != o.OverloadFactor {
			add("flood %v is not %v x capacity %v", or.FloodOfferedOps, or.Factor, or.CapacityOps)
		}
		if or.ThroughputOps <= 0 || !near(or.ShareOfCapacity, or.ThroughputOps/or.CapacityOps) {
			add("throughput %v, share %v", or.ThroughputOps, or.ShareOfCapacity)
		}
		if or.ThrottledByTenant == nil {
			add("no THROTTLED counts by tenant")
		}
		if p.Replication == "paxos" && len(o.Endpoints) == 0 && or.ShedByClass == nil {
			add("the overload guard's synod_overload_shed_total was not read")
		}
		if want := map[bool]string{false: victimsOwnProcess, true: victimsInline}[o.VictimsInline]; or.VictimsIn != want {
			add("victims ran in %q, want %q", or.VictimsIn, want)
		}
		if len(or.Victims) != 2 {
			add("%d victims, want 2", len(or.Victims))
		}
		for _, v := range or.Victims {
			if v.Quiet.Count == 0 || v.Flood.Count == 0 || v.Quiet.P99Us == 0 || v.Flood.P99Us == 0 ||
				!near(v.Ratio, float64(v.Flood.P99Us)/float64(v.Quiet.P99Us)) || v.Priority == "" {
				add("victim %+v", v)
			}
		}
	case scenLoad:
		lr := ph.Load
		if lr == nil {
			add("no load figures")
			break
		}
		if lr.Stalled || lr.CutOff || lr.LoadedBytes < lr.TargetBytes {
			add("loaded %d of %d bytes (stalled %v, cut off %v: %s)", lr.LoadedBytes, lr.TargetBytes, lr.Stalled, lr.CutOff, lr.StallNote)
		}
		if want := min(lr.LoadedBytes, lr.TargetBytes) / lr.StepBytes; int64(len(lr.Steps)) < want || len(lr.Steps) == 0 {
			add("%d step rows for %d bytes in steps of %d", len(lr.Steps), lr.LoadedBytes, lr.StepBytes)
		}
		for i, st := range lr.Steps {
			if st.MBps <= 0 || st.Seconds <= 0 || st.LoadedBytes != int64(i+1)*lr.StepBytes || !samplesComplete(st.Nodes, o.Nodes) {
				add("step %d: %+v", i, st)
			}
		}
		if lr.FirstMBps <= 0 || lr.LastMBps <= 0 || lr.Slowdown <= 0 {
			add("first/last MB/s %v/%v slowdown %v", lr.FirstMBps, lr.LastMBps, lr.Slowdown)
		}
		if !samplesComplete(lr.End, o.Nodes) || len(lr.SnapshotsTaken) != o.Nodes || len(lr.SnapshotsInstalled) != o.Nodes || len(lr.SnapshotMeanSec) != o.Nodes {
			add("end figures %+v, snapshots %v/%v/%v", lr.End, lr.SnapshotsTaken, lr.SnapshotsInstalled, lr.SnapshotMeanSec)
		}
		fr := lr.Restart
		switch {
		case fr == nil:
			add("no follower restart")
		case fr.Node < 1 || fr.Node > o.Nodes || fr.LeaderCommitAtRestart == 0 || fr.DownSeconds < 0.9*o.LoadDown.Seconds() ||
			fr.LeaderAtRestart < 1 || fr.LeaderAtRestart > o.Nodes || fr.LeaderAtRestart == fr.Node:
			add("restart %+v", fr)
		case fr.CatchUpSeconds < 0 || fr.AppliedAtEnd < fr.LeaderCommitAtRestart:
			add("the follower did not catch up: %+v", fr)
		}
	}
	return out
}

// samplesComplete: one sample per node, each with a resident set and
// something on disk.
func samplesComplete(ns []NodeSample, nodes int) bool {
	if len(ns) != nodes {
		return false
	}
	for _, n := range ns {
		if n.RSSBytes <= 0 || n.DiskBytes() <= 0 {
			return false
		}
	}
	return true
}

// completePhase returns a phase of scenario s with every figure the
// checks want (for the planted-gap test).
func completePhase(s string, o *Options) *PhaseResult {
	h := hist.Summary{Count: 10, P50Us: 1, P90Us: 2, P99Us: 3, P999Us: 4, MaxUs: 5}
	nodes := make([]NodeSample, o.Nodes)
	for i := range nodes {
		nodes[i] = NodeSample{Node: i + 1, RSSBytes: 1 << 20, DataBytes: 1 << 20, LogBytes: 1 << 20}
	}
	ph := &PhaseResult{Scenario: s, Read: h, Write: h, Victim: h, ThroughputOps: 100,
		TenantP99Us: make([]int64, o.Tenants), ReadCurve: []hist.Point{{}}, WriteCurve: []hist.Point{{}},
		CPUSeconds: 1, CPUPer1000: 0.5, BulkScan: h, HogNote: "pinned",
		Cluster: &ClusterWindow{LeaderChangesMetric: 0, LeaderChangesByNode: make([]int, o.Nodes), Nodes: nodes}}
	steal := 1.5
	ph.HostStealPct = &steal
	switch s {
	case scenCeiling:
		ph.Ceiling = &CeilingResult{Inflight: o.CeilingInflight, Clients: 8, PutsPerSec: 100}
	case scenTail:
		ph.Tail = &TailResult{CapacityOps: 200, CapacitySource: "ceiling phase", Share: o.TailShare, OfferedOps: o.TailShare * 200, P99OverP50: 3, P999OverP50: 4}
		ph.Tail.setStore(&StageFigures{Stage: "service", Count: 100, P50Ms: 1, P99Ms: 3, P999Ms: 4})
	case scenOverload:
		v := VictimFigures{Priority: "critical", Quiet: h, Flood: h, Ratio: 1}
		ph.Overload = &OverloadResult{CapacityOps: 200, Factor: o.OverloadFactor, FloodOfferedOps: o.OverloadFactor * 200,
			ThroughputOps: 190, ShareOfCapacity: 0.95, ThrottledByTenant: map[string]int64{}, ShedByClass: map[string]int64{},
			Victims: []VictimFigures{v, v}, VictimsIn: victimsOwnProcess}
	case scenLoad:
		step := int64(o.LoadStepMiB) << 20
		target := int64(o.LoadGiB * (1 << 30))
		lr := &LoadResult{TargetBytes: target, StepBytes: step, LoadedBytes: target, FirstMBps: 2, LastMBps: 1, Slowdown: 2,
			End: nodes, SnapshotsTaken: make([]int64, o.Nodes), SnapshotsInstalled: make([]int64, o.Nodes), SnapshotMeanSec: make([]float64, o.Nodes),
			Restart: &FollowerRestart{Node: 2, LeaderAtRestart: 1, DownSeconds: o.LoadDown.Seconds(), LeaderCommitAtRestart: 10, AppliedAtEnd: 10, CatchUpSeconds: 1}}
		for i := int64(1); i*step <= target; i++ {
			lr.Steps = append(lr.Steps, LoadStep{LoadedBytes: i * step, Seconds: 1, MBps: 1, Nodes: nodes})
		}
		ph.Load = lr
	}
	return ph
}
