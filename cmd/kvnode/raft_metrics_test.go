package main

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/raftpath"
)

// TestRaftCollectorExportsPaxosNames: the raft path's registry exports the
// series kvbench and the dashboards read under the Paxos path's names,
// with the node's own counts (a single-member node elects itself: one
// leader learned; no snapshot yet).
func TestRaftCollectorExportsPaxosNames(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n, err := raftpath.Open(raftpath.Config{ID: 1, Peers: []raftpath.Peer{{ID: 1, Addr: ln.Addr().String()}},
		DataDir: filepath.Join(t.TempDir(), "n1"), Tick: 5 * time.Millisecond, ElectionTicks: 10, HeartbeatTicks: 1,
		Listener: ln, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for deadline := time.Now().Add(10 * time.Second); n.Leader() != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the single node did not elect itself")
		}
	}
	mfs, err := raftPromRegistry(n).Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				got[mf.GetName()] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				got[mf.GetName()+"_count"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	want := map[string]float64{
		"synod_leader_changes_total":      float64(n.LeaderChanges()),
		"synod_snapshots_installed_total": 0,
		"synod_snapshots_total":           0,
		"synod_snapshot_seconds_count":    0,
	}
	for name, v := range want {
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s = %v (exported %v), want %v", name, g, ok, v)
		}
	}
	if n.LeaderChanges() < 1 {
		t.Errorf("the node elected itself but counts %d leader changes", n.LeaderChanges())
	}
}
