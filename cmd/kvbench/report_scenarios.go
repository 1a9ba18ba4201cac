package main

// The table rows of the ceiling, tail, overload and load scenarios, the
// leader changes of every scenario, and the load scenario's per-step
// detail. Rows of a scenario appear only when some path ran it.

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// ranScenario reports whether some path of r has a phase of scenario s.
func ranScenario(r *Report, s string) bool {
	for _, p := range r.Paths {
		if p.Phases[s] != nil {
			return true
		}
	}
	return false
}

// size formats a byte count as GiB, or MiB below 1 GiB.
func size(b int64) string {
	if b >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// mib formats bytes as MiB (-1: unknown).
func mib(b int64) string {
	if b < 0 {
		return "?"
	}
	return fmt.Sprintf("%.0f", float64(b)/(1<<20))
}

// scenarioRows adds the rows of the scenarios beyond steady/noisy/hog and
// one leader-change row and one host-steal row per scenario that ran. row
// is writeTable's.
func scenarioRows(r *Report, row func(name string, f func(p *PathResult) string)) {
	// get returns p's phase s, or nil; cell prints "-" for a path
	// without it.
	cell := func(s string, f func(ph *PhaseResult) string) func(p *PathResult) string {
		return func(p *PathResult) string {
			ph := p.Phases[s]
			if ph == nil {
				return "-"
			}
			return f(ph)
		}
	}
	if ranScenario(r, scenCeiling) {
		row(fmt.Sprintf("ceiling puts/s (%d in flight)", r.Options.CeilingInflight), cell(scenCeiling, func(ph *PhaseResult) string {
			return fmt.Sprintf("%.0f", ph.ThroughputOps)
		}))
	}
	if ranScenario(r, scenTail) {
		row(fmt.Sprintf("tail: open loop at %.0f%% cap", r.Options.TailShare*100), cell(scenTail, func(ph *PhaseResult) string {
			return fmt.Sprintf("%.0f/s", ph.Tail.OfferedOps)
		}))
		row("tail write P50", cell(scenTail, func(ph *PhaseResult) string { return ms(ph.Write.P50Us) }))
		row("tail write P99", cell(scenTail, func(ph *PhaseResult) string { return ms(ph.Write.P99Us) }))
		row("tail write P99.9", cell(scenTail, func(ph *PhaseResult) string { return ms(ph.Write.P999Us) }))
		row(fmt.Sprintf("tail P99/P50 (goal <=%d)", tailP99RatioGoal), cell(scenTail, func(ph *PhaseResult) string { return fmt.Sprintf("%.1f", ph.Tail.P99OverP50) }))
		row(fmt.Sprintf("tail P99.9/P50 (goal <=%d)", tailP999RatioGoal), cell(scenTail, func(ph *PhaseResult) string { return fmt.Sprintf("%.1f", ph.Tail.P999OverP50) }))
		row("tail in store P50/P99/P99.9", cell(scenTail, func(ph *PhaseResult) string {
			if ph.Tail.Store == nil {
				return "-"
			}
			return fmt.Sprintf("%.2f/%.2f/%.2f", ph.Tail.Store.P50Ms, ph.Tail.Store.P99Ms, ph.Tail.Store.P999Ms)
		}))
		row("tail in store ratios", cell(scenTail, func(ph *PhaseResult) string {
			if ph.Tail.Store == nil {
				return "-"
			}
			return fmt.Sprintf("%.1f, %.1f", ph.Tail.StoreP99OverP50, ph.Tail.StoreP999OverP50)
		}))
	}
	if ranScenario(r, scenOverload) {
		ov := func(f func(or *OverloadResult) string) func(p *PathResult) string {
			return cell(scenOverload, func(ph *PhaseResult) string { return f(ph.Overload) })
		}
		row(fmt.Sprintf("overload: flood at %.1fx cap", r.Options.OverloadFactor), ov(func(or *OverloadResult) string { return fmt.Sprintf("%.0f/s", or.FloodOfferedOps) }))
		row(fmt.Sprintf("overload tput %% cap (>=%.0f)", overloadShareGoal*100), ov(func(or *OverloadResult) string { return fmt.Sprintf("%.0f%%", or.ShareOfCapacity*100) }))
		row("THROTTLED crit/std/bulk", ov(func(or *OverloadResult) string {
			if or.ShedByClass == nil {
				return fmt.Sprintf("client %d/%d/%d", or.ThrottledByTenant["victim-critical"], or.ThrottledByTenant["victim-standard"], or.ThrottledByTenant["flood"])
			}
			return fmt.Sprintf("%d/%d/%d", or.ShedByClass["critical"], or.ShedByClass["standard"], or.ShedByClass["bulk"])
		}))
		for k, name := range []string{"crit", "std"} {
			row(fmt.Sprintf("victim %s P99 quiet/flood", name), ov(func(or *OverloadResult) string {
				if k >= len(or.Victims) {
					return "-"
				}
				v := or.Victims[k]
				return fmt.Sprintf("%s/%s", ms(v.Quiet.P99Us), ms(v.Flood.P99Us))
			}))
		}
		row("victims' client, lag max ms", ov(func(or *OverloadResult) string {
			return fmt.Sprintf("%s, %.1f", or.VictimsIn, or.VictimLagMs)
		}))
		row(fmt.Sprintf("victim P99 x crit/std (<=%.0f)", overloadVictimRatioGoal), ov(func(or *OverloadResult) string {
			var parts []string
			for _, v := range or.Victims {
				parts = append(parts, fmt.Sprintf("%.2f", v.Ratio))
			}
			return strings.Join(parts, "/")
		}))
		row("in store: victim P99 quiet/flood", ov(func(or *OverloadResult) string {
			var parts []string
			for _, v := range or.Victims {
				if v.Store == nil {
					parts = append(parts, "-")
					continue
				}
				parts = append(parts, fmt.Sprintf("%.1f/%.1f ms", v.Store.QuietP99Ms, v.Store.FloodP99Ms))
			}
			return strings.Join(parts, ", ")
		}))
		row(fmt.Sprintf("in store: victim P99 x crit/std (<=%.0f)", overloadVictimRatioGoal), ov(func(or *OverloadResult) string {
			var parts []string
			for _, v := range or.Victims {
				if v.Store == nil {
					parts = append(parts, "-")
					continue
				}
				parts = append(parts, fmt.Sprintf("%.2f", v.Store.Ratio))
			}
			return strings.Join(parts, "/")
		}))
	}
	if ranScenario(r, scenLoad) {
		ld := func(f func(lr *LoadResult) string) func(p *PathResult) string {
			return cell(scenLoad, func(ph *PhaseResult) string { return f(ph.Load) })
		}
		row("load acked", ld(func(lr *LoadResult) string {
			s := size(lr.LoadedBytes)
			switch {
			case lr.Stalled:
				s += " stalled"
			case lr.CutOff:
				s += " cut off"
			}
			return s
		}))
		row("load MB/s first/last step", ld(func(lr *LoadResult) string { return fmt.Sprintf("%.1f/%.1f", lr.FirstMBps, lr.LastMBps) }))
		row(fmt.Sprintf("load slowdown x (<=%.0f)", loadSlowdownGoal), ld(func(lr *LoadResult) string {
			if lr.Slowdown == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", lr.Slowdown)
		}))
		row("load RSS MiB max node", ld(func(lr *LoadResult) string {
			var m int64 = -1
			for _, n := range lr.End {
				m = max(m, n.RSSBytes)
			}
			return mib(m)
		}))
		row("load disk MiB max node", ld(func(lr *LoadResult) string {
			var m int64 = -1
			for _, n := range lr.End {
				m = max(m, n.DiskBytes())
			}
			return mib(m)
		}))
		row("load snapshots taken/inst", ld(func(lr *LoadResult) string {
			return fmt.Sprintf("%s/%s", sumKnown(lr.SnapshotsTaken), sumKnown(lr.SnapshotsInstalled))
		}))
		row(fmt.Sprintf("load catch-up s (<%.0f)", loadCatchupGoal.Seconds()), ld(func(lr *LoadResult) string {
			if lr.Restart == nil || lr.Restart.CatchUpSeconds < 0 {
				return "no"
			}
			return fmt.Sprintf("%.1f", lr.Restart.CatchUpSeconds)
		}))
	}
	for _, s := range allScenarios {
		if !ranScenario(r, s) {
			continue
		}
		row("leader changes "+s, cell(s, leaderChangesOf))
	}
	for _, s := range allScenarios {
		if !ranScenario(r, s) {
			continue
		}
		row("host steal % "+s, cell(s, stealOf)) // host_steal.go
	}
}

// sumKnown sums the known (>= 0) values, "?" when none is known.
func sumKnown(v []int64) string {
	var s int64
	known := false
	for _, x := range v {
		if x >= 0 {
			s += x
			known = true
		}
	}
	if !known {
		return "?"
	}
	return fmt.Sprint(s)
}

// writeLoadDetail prints the load scenario's rows per step for every path
// that ran it: MB/s, and each node's RSS, disk use and snapshot counts.
func writeLoadDetail(w io.Writer, r *Report) {
	for _, p := range r.Paths {
		ph := p.Phases[scenLoad]
		if ph == nil || ph.Load == nil {
			continue
		}
		lr := ph.Load
		fmt.Fprintf(w, "\nload, %s (%s): %d writers, %d B values, unique keys, target %s; a row per %d MiB acknowledged\n",
			p.Name, p.Durability, lr.Writers, lr.ValueBytes, size(lr.TargetBytes), lr.StepBytes>>20)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "MiB acked\tstep s\tMB/s\tRSS MiB per node\tdisk MiB per node (data+log)\tsnapshots taken/installed per node (since its start)\t\n")
		for _, st := range lr.Steps {
			var rss, disk, snaps []string
			for _, n := range st.Nodes {
				rss = append(rss, mib(n.RSSBytes))
				disk = append(disk, mib(n.DiskBytes()))
				snaps = append(snaps, fmt.Sprintf("%s/%s", countOrQ(n.SnapshotsTaken), countOrQ(n.SnapshotsInstalled)))
			}
			fmt.Fprintf(tw, "%d\t%.1f\t%.1f\t%s\t%s\t%s\t\n", st.LoadedBytes>>20, st.Seconds, st.MBps,
				strings.Join(rss, " "), strings.Join(disk, " "), strings.Join(snaps, " "))
		}
		tw.Flush()
		switch {
		case lr.Stalled || lr.CutOff:
			fmt.Fprintf(w, "  %s (%.1f MB/s on average)\n", lr.StallNote, float64(lr.LoadedBytes)/1e6/max(lr.Seconds, 1e-9))
		default:
			fmt.Fprintf(w, "  loaded %s in %.0f s (%.1f MB/s on average)\n", size(lr.LoadedBytes), lr.Seconds,
				float64(lr.LoadedBytes)/1e6/max(lr.Seconds, 1e-9))
		}
		var means []string
		for _, m := range lr.SnapshotMeanSec {
			means = append(means, secsOrQ(m))
		}
		fmt.Fprintf(w, "  snapshots over the load, per node: taken %v, installed %v, mean seconds to take one %s\n",
			lr.SnapshotsTaken, lr.SnapshotsInstalled, strings.Join(means, " "))
		if lr.Transfers != nil {
			var parts []string
			for _, tr := range lr.Transfers {
				parts = append(parts, fmt.Sprintf("%s sent (%s s) / %s received (%s s)",
					countOrQ(tr.Sent), secsOrQ(tr.SentMeanSec), countOrQ(tr.Received), secsOrQ(tr.ReceivedMeanSec)))
			}
			fmt.Fprintf(w, "  snapshot transfers over the load, per node (mean seconds): %s\n", strings.Join(parts, ", "))
		}
		if fr := lr.Restart; fr != nil {
			fmt.Fprintf(w, "  follower %d SIGKILLed for %.1f s while %s were loaded; leader (node %d) commit at its restart %d; ",
				fr.Node, fr.DownSeconds, size(fr.LoadedWhileDownBytes), fr.LeaderAtRestart, fr.LeaderCommitAtRestart)
			if fr.CatchUpSeconds >= 0 {
				fmt.Fprintf(w, "caught up in %.1f s", fr.CatchUpSeconds)
			} else {
				fmt.Fprintf(w, "NOT caught up")
			}
			fmt.Fprintf(w, " (snapshots installed after the restart: %s", countOrQ(fr.SnapshotsInstalled))
			if fr.SnapshotReceivedSeconds >= 0 {
				fmt.Fprintf(w, ", receiving them took %.1f s", fr.SnapshotReceivedSeconds)
			}
			if fr.SnapshotReceivedBytes >= 0 {
				fmt.Fprintf(w, ", %s received", size(int64(fr.SnapshotReceivedBytes)))
			}
			if fr.DeltaRangesKept >= 0 && fr.DeltaRangesKept+fr.DeltaRangesReplaced > 0 {
				fmt.Fprintf(w, ", delta: %.0f ranges kept, %.0f sent", fr.DeltaRangesKept, fr.DeltaRangesReplaced)
			}
			fmt.Fprint(w, ")")
			if fr.Note != "" {
				fmt.Fprintf(w, "; %s", fr.Note)
			}
			fmt.Fprintln(w)
		}
		if lr.Errors > 0 {
			fmt.Fprintf(w, "  %d puts failed and were tried again: %v\n", lr.Errors, lr.ErrorKinds)
		}
	}
}

func secsOrQ(v float64) string {
	if v < 0 {
		return "?"
	}
	return fmt.Sprintf("%.2f", v)
}

func countOrQ(v int64) string {
	if v < 0 {
		return "?"
	}
	return fmt.Sprint(v)
}
