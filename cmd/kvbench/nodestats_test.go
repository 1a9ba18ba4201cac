package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWindowOf: the window's counts are the nodes' counter increases; a
// node whose counter went back (it restarted) or that did not answer at
// one end is unknown, not zero; the leader-change count is the largest
// known increase; shedding sums over the nodes by class.
func TestWindowOf(t *testing.T) {
	shed := func(class string) string { return metricShed + `{class="` + class + `"}` }
	start := []metrics{
		{metricLeaderChanges: 1, metricSnapshots: 2, shed("bulk"): 10, shed("critical"): 0, shed("standard"): 0},
		{metricLeaderChanges: 1, metricSnapshots: 2, shed("bulk"): 5, shed("critical"): 0, shed("standard"): 0},
		{metricLeaderChanges: 5},
		nil,
	}
	end := []metrics{
		{metricLeaderChanges: 1, metricSnapshots: 4, shed("bulk"): 30, shed("critical"): 0, shed("standard"): 1},
		{metricLeaderChanges: 3, metricSnapshots: 3, shed("bulk"): 5, shed("critical"): 0, shed("standard"): 0},
		{metricLeaderChanges: 1}, // restarted: the counter went back
		{metricLeaderChanges: 9}, // no scrape at the start
	}
	cw := windowOf(start, end, nil)
	if want := []int{0, 2, -1, -1}; !equalInts(cw.LeaderChangesByNode, want) {
		t.Errorf("by node %v, want %v", cw.LeaderChangesByNode, want)
	}
	if cw.LeaderChangesMetric != 2 {
		t.Errorf("leader changes %d, want 2", cw.LeaderChangesMetric)
	}
	if cw.SnapshotsTaken != 3 || cw.SnapshotsInstalled != -1 {
		t.Errorf("snapshots %d/%d, want 3/-1", cw.SnapshotsTaken, cw.SnapshotsInstalled)
	}
	if cw.ShedByClass["bulk"] != 20 || cw.ShedByClass["standard"] != 1 || cw.ShedByClass["critical"] != 0 {
		t.Errorf("shed %v", cw.ShedByClass)
	}
	excludeRestarted(cw, 2)
	if cw.LeaderChangesMetric != 0 || cw.LeaderChangesByNode[1] != -1 {
		t.Errorf("after excluding node 2: %d %v", cw.LeaderChangesMetric, cw.LeaderChangesByNode)
	}
	// No guard metrics at all (the raft path): no shedding map.
	if cw := windowOf([]metrics{{metricLeaderChanges: 0}}, []metrics{{metricLeaderChanges: 0}}, nil); cw.ShedByClass != nil || cw.LeaderChangesMetric != 0 {
		t.Errorf("raft-like window %+v", cw)
	}
	// Nothing readable: unknown, never a reassuring zero.
	if cw := windowOf([]metrics{nil}, []metrics{nil}, nil); cw.LeaderChangesMetric != -1 {
		t.Errorf("unreadable window reports %d leader changes", cw.LeaderChangesMetric)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestLeaderChangesOf: the table shows the polls' count, and the nodes'
// count beside it when that differs.
func TestLeaderChangesOf(t *testing.T) {
	for _, tc := range []struct {
		polls, metric int
		window        bool
		want          string
	}{
		{0, 0, true, "0"}, {1, 2, true, "1 (2)"}, {0, 1, true, "0 (1)"}, {2, -1, true, "2"}, {3, 0, false, "3"},
	} {
		ph := &PhaseResult{LeaderChanges: tc.polls}
		if tc.window {
			ph.Cluster = &ClusterWindow{LeaderChangesMetric: tc.metric}
		}
		if got := leaderChangesOf(ph); got != tc.want {
			t.Errorf("%+v: %q", tc, got)
		}
	}
}

// TestDiskBytes counts allocated blocks under a directory, a single
// file, and 0 for a missing path.
func TestDiskBytes(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o700)
	if err := os.WriteFile(filepath.Join(sub, "b"), make([]byte, 32<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	all, err := diskBytes(dir)
	if err != nil || all < 96<<10 {
		t.Fatalf("dir: %d %v", all, err)
	}
	one, err := diskBytes(filepath.Join(sub, "b"))
	if err != nil || one < 32<<10 || one >= all {
		t.Fatalf("file: %d %v (dir %d)", one, err, all)
	}
	if n, err := diskBytes(filepath.Join(dir, "missing")); err != nil || n != 0 {
		t.Fatalf("missing: %d %v", n, err)
	}
	// A hard link (a checkpoint's) counts once, as du counts it.
	if err := os.Link(filepath.Join(dir, "a"), filepath.Join(sub, "a-link")); err != nil {
		t.Fatal(err)
	}
	if linked, err := diskBytes(dir); err != nil || linked != all {
		t.Fatalf("with a hard link: %d %v, want %d", linked, err, all)
	}
}

// TestLoadSteps: every step boundary the acknowledged bytes cross is
// recorded once, also when one acknowledgement crosses several.
func TestLoadSteps(t *testing.T) {
	lw := &loadWriters{step: 10}
	for _, n := range []int64{4, 4, 4, 25, 3} { // 4 8 12 37 40
		lw.ack(n)
	}
	if got := len(lw.steps()); got != 4 {
		t.Fatalf("%d steps recorded for 40 bytes in steps of 10, want 4", got)
	}
	if lw.acked.Load() != 40 {
		t.Fatalf("acked %d", lw.acked.Load())
	}
}

// TestLoadSnapshotFigures: snapshot counts and mean durations over the
// load are the increases between the two scrapes, except for the
// restarted follower, whose counters began again at its restart; what a
// node does not export is unknown (-1), never zero.
func TestLoadSnapshotFigures(t *testing.T) {
	recv := func(part string) string {
		return histSeries(metricSnapshotTransferSeconds, part, "direction", "received")
	}
	sent := func(part string) string { return histSeries(metricSnapshotTransferSeconds, part, "direction", "sent") }
	start := []metrics{
		{metricSnapshots: 2, metricSnapshotsInstalled: 0, "synod_snapshot_seconds_sum": 1, "synod_snapshot_seconds_count": 2,
			sent("sum"): 0, sent("count"): 0, recv("sum"): 0, recv("count"): 0},
		{metricSnapshots: 5, metricSnapshotsInstalled: 1},
		{metricSnapshots: 9},
	}
	end := []metrics{
		{metricSnapshots: 6, metricSnapshotsInstalled: 0, "synod_snapshot_seconds_sum": 3, "synod_snapshot_seconds_count": 6,
			sent("sum"): 4, sent("count"): 2, recv("sum"): 0, recv("count"): 0},
		{metricSnapshots: 5, metricSnapshotsInstalled: 1},
		{metricSnapshots: 1, metricSnapshotsInstalled: 1, recv("sum"): 2.5, recv("count"): 1}, // restarted
	}
	lr := &LoadResult{}
	lr.snapshotFigures(start, end, 3)
	if want := []int64{4, 0, 1}; !equal64(lr.SnapshotsTaken, want) {
		t.Errorf("taken %v, want %v", lr.SnapshotsTaken, want)
	}
	if want := []int64{0, 0, 1}; !equal64(lr.SnapshotsInstalled, want) {
		t.Errorf("installed %v, want %v", lr.SnapshotsInstalled, want)
	}
	if lr.SnapshotMeanSec[0] != 0.5 || lr.SnapshotMeanSec[1] != -1 || lr.SnapshotMeanSec[2] != -1 {
		t.Errorf("mean seconds %v, want [0.5 -1 -1]", lr.SnapshotMeanSec)
	}
	if len(lr.Transfers) != 3 {
		t.Fatalf("transfers %v", lr.Transfers)
	}
	if tr := lr.Transfers[0]; tr.Sent != 2 || tr.SentMeanSec != 2 || tr.Received != 0 || tr.ReceivedMeanSec != -1 {
		t.Errorf("node 1 transfers %+v", tr)
	}
	if tr := lr.Transfers[1]; tr.Sent != -1 || tr.Received != -1 {
		t.Errorf("node 2 exports no transfers, got %+v", tr)
	}
	if tr := lr.Transfers[2]; tr.Received != 1 || tr.ReceivedMeanSec != 2.5 {
		t.Errorf("restarted node 3 transfers %+v", tr)
	}
	// A path without the transfer series reports none at all.
	lr = &LoadResult{}
	lr.snapshotFigures([]metrics{{metricSnapshots: 1}}, []metrics{{metricSnapshots: 1}}, -1)
	if lr.Transfers != nil {
		t.Errorf("transfers %v from a node that exports none", lr.Transfers)
	}
}

func equal64(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
