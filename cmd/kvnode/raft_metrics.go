package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"synod/raftpath"
)

// raftCollector exports the raft path's counters under the names the
// Paxos path uses (kv/replica/metrics.go), so that a dashboard or kvbench
// reads both paths alike. Semantics differ in one place: raft counts
// every time this node learns a leader (also the same one again, after
// its own pre-vote cleared it); the Paxos path counts every change of
// the leader it knows, to none included.
type raftCollector struct {
	n                                            *raftpath.Node
	leaderChanges, installed, taken, snapSeconds *prometheus.Desc
}

func newRaftCollector(n *raftpath.Node) *raftCollector {
	return &raftCollector{
		n: n,
		leaderChanges: prometheus.NewDesc("synod_leader_changes_total",
			"Times this replica learned a leader (raft: counted when the known leader becomes a node, also the same node again after a pre-vote).", nil, nil),
		installed: prometheus.NewDesc("synod_snapshots_installed_total",
			"Snapshots received from a leader and restored.", nil, nil),
		taken: prometheus.NewDesc("synod_snapshots_total",
			"Snapshots taken for compaction.", nil, nil),
		snapSeconds: prometheus.NewDesc("synod_snapshot_seconds",
			"Time taking one snapshot for compaction took (raft: flush, WAL record and log compaction; the Ready loop waits for it).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *raftCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.leaderChanges
	ch <- c.installed
	ch <- c.taken
	ch <- c.snapSeconds
}

// Collect implements prometheus.Collector.
func (c *raftCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.leaderChanges, prometheus.CounterValue, float64(c.n.LeaderChanges()))
	ch <- prometheus.MustNewConstMetric(c.installed, prometheus.CounterValue, float64(c.n.SnapshotsRestored()))
	count, took := c.n.SnapshotsTaken()
	ch <- prometheus.MustNewConstMetric(c.taken, prometheus.CounterValue, float64(count))
	// A histogram without buckets: its _sum and _count give the mean.
	ch <- prometheus.MustNewConstHistogram(c.snapSeconds, count, took.Seconds(), nil)
}

// raftPromRegistry is the raft path's registry: the process collectors
// and the node's counters.
func raftPromRegistry(n *raftpath.Node) *prometheus.Registry {
	reg := newPromRegistry()
	reg.MustRegister(newRaftCollector(n))
	return reg
}
