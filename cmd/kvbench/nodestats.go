package main

// What kvbench reads about each embedded node besides latency: its
// resident memory (/proc/PID/status), its disk use (state machine and
// acceptor log or WAL), and, over a recorded window, what its /metrics
// counted (leader changes, snapshots, THROTTLED by priority).

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// NodeSample is one node's footprint at one moment. A figure that could
// not be read is -1.
type NodeSample struct {
	Node int `json:"node"`
	// RSSBytes is the process's resident set (VmRSS).
	RSSBytes int64 `json:"rss_bytes"`
	// DataBytes is the state machine's directory (Pebble) on disk;
	// LogBytes the acceptor log file (paxos) or the WAL directory (raft).
	DataBytes int64 `json:"data_bytes"`
	LogBytes  int64 `json:"log_bytes"`
	// From the node's /metrics (-1: not exported or not reachable).
	SnapshotsTaken     int64   `json:"snapshots_taken"`
	SnapshotsInstalled int64   `json:"snapshots_installed"`
	SnapshotSecondsSum float64 `json:"snapshot_seconds_sum"` // -1: no snapshot duration metric
	LogUsedBytes       int64   `json:"log_used_bytes"`
	LogFull            int64   `json:"log_full"`
	LeaderChanges      int64   `json:"leader_changes"`
}

// DiskBytes is the node's total on disk (data and log), -1 if unknown.
func (s NodeSample) DiskBytes() int64 {
	if s.DataBytes < 0 || s.LogBytes < 0 {
		return -1
	}
	return s.DataBytes + s.LogBytes
}

// parseVmRSS reads the VmRSS line ("VmRSS:   123456 kB") of a
// /proc/PID/status text.
func parseVmRSS(b []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "VmRSS:") {
			continue
		}
		f := strings.Fields(strings.TrimPrefix(l, "VmRSS:"))
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("odd VmRSS line %q", l)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 || kb > 1<<40 {
			return 0, fmt.Errorf("odd VmRSS line %q", l)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no VmRSS line (a zombie or kernel thread?)")
}

// nodeDirs returns where node i (1-based) of c keeps its state machine
// and its log: the acceptor log file (paxos) or the WAL directory (raft),
// and whether the log lies inside the data directory.
func (c *cluster) nodeDirs(i int) (data, log string, logInData bool) {
	data = filepath.Join(c.dir, fmt.Sprintf("node%d", i))
	if c.path.Replication == "raft" {
		if c.path.walOnShm {
			return data, filepath.Join(c.shmDir, fmt.Sprintf("node%d-raft", i)), false
		}
		return data, filepath.Join(data, "raft"), true
	}
	logDir := c.dir
	if c.path.pmemMode == "shm" {
		logDir = c.shmDir
	}
	return data, filepath.Join(logDir, fmt.Sprintf("node%d.pmem", i)), false
}

// sampleNodes reads every embedded node's footprint and, from m (a
// scrape of the same moment; nil entries unknown), its counters.
func (c *cluster) sampleNodes(m []metrics) []NodeSample {
	pids := c.pids()
	out := make([]NodeSample, len(pids))
	for k, pid := range pids {
		s := NodeSample{Node: k + 1, RSSBytes: -1, DataBytes: -1, LogBytes: -1}
		if v, err := rssBytes(pid); err == nil {
			s.RSSBytes = v
		}
		data, log, logInData := c.nodeDirs(k + 1)
		d, errD := diskBytes(data)
		l, errL := diskBytes(log)
		if errD == nil && errL == nil {
			if logInData {
				d -= l
			}
			s.DataBytes, s.LogBytes = d, l
		}
		var mk metrics
		if k < len(m) {
			mk = m[k]
		}
		fillCounters(&s, mk)
		out[k] = s
	}
	return out
}

// fillCounters copies the counters of scrape m into s (-1 where m lacks
// them).
func fillCounters(s *NodeSample, m metrics) {
	num := func(series string) int64 {
		if v, ok := m.get(series); ok {
			return int64(v)
		}
		return -1
	}
	s.SnapshotsTaken = num(metricSnapshots)
	s.SnapshotsInstalled = num(metricSnapshotsInstalled)
	s.LogUsedBytes = num(metricLogUsed)
	s.LogFull = num(metricLogFull)
	s.LeaderChanges = num(metricLeaderChanges)
	s.SnapshotSecondsSum = -1
	if v, ok := m.get(metricSnapshotSeconds + "_sum"); ok {
		s.SnapshotSecondsSum = v
	}
}

// ClusterWindow is what the nodes' /metrics counted over one recorded
// window, and their footprint at its end.
type ClusterWindow struct {
	// LeaderChangesByNode is each node's synod_leader_changes_total
	// increase over the window (-1: not readable at both ends);
	// LeaderChangesMetric the largest of them (-1: none readable). A
	// change of leader is seen by every node, so the largest is the
	// count as the nodes see it. The counters also see near misses the
	// polls do not: the paxos counter counts a node's leader becoming
	// unknown (an election starting) as a change, so one election may
	// count twice there; the raft counter counts every time a node learns
	// a leader, also the same one again after the node's own pre-vote.
	LeaderChangesByNode []int `json:"leader_changes_by_node"`
	LeaderChangesMetric int   `json:"leader_changes_metric"`
	// ShedByClass sums every node's synod_overload_shed_total increase
	// per priority class (absent: the path has no overload guard).
	ShedByClass map[string]int64 `json:"shed_by_class,omitempty"`
	// SnapshotsTaken and SnapshotsInstalled sum the nodes' increases
	// (-1: not exported).
	SnapshotsTaken     int64 `json:"snapshots_taken"`
	SnapshotsInstalled int64 `json:"snapshots_installed"`
	// Nodes is every node's footprint at the end of the window.
	Nodes []NodeSample `json:"nodes"`
	// Stages is the per-stage latency and the stalls (stages.go).
	Stages *StageWindow `json:"stages,omitempty"`
	// LoadService is the load tenant's service time inside the nodes
	// (admission to reply, synod_tenant_latency_seconds, summed over the
	// nodes): the ceiling and tail writers' latency without the client's
	// own time. Nil when a node missed a scrape or the tenant sent nothing.
	LoadService *StageFigures `json:"load_service,omitempty"`
}

// windowWatch measures one ClusterWindow: open scrapes at the start,
// close at the end.
type windowWatch struct {
	c     *cluster
	start []metrics
}

func (c *cluster) openWindow(ctx context.Context) *windowWatch {
	return &windowWatch{c: c, start: c.scrapeAll(ctx)}
}

// close scrapes again and returns the window's figures (nil for an
// existing cluster, whose admin endpoints kvbench does not know).
func (w *windowWatch) close(ctx context.Context) *ClusterWindow {
	if len(w.c.admins) == 0 {
		return nil
	}
	end := w.c.scrapeAll(ctx)
	cw := windowOf(w.start, end, w.c.sampleNodes(end))
	cw.Stages = stagesOf(w.start, end, traceDirsOf(w.c)) // stages.go
	if f, ok := tenantService(loadTenantName, w.start, end); ok && f.Count > 0 {
		cw.LoadService = &f
	}
	return cw
}

// windowOf computes a window's deltas from the scrapes at its two ends.
func windowOf(start, end []metrics, nodes []NodeSample) *ClusterWindow {
	cw := &ClusterWindow{LeaderChangesMetric: -1, SnapshotsTaken: -1, SnapshotsInstalled: -1, Nodes: nodes}
	delta := func(k int, series string) (float64, bool) {
		if k >= len(start) || start[k] == nil || end[k] == nil {
			return 0, false
		}
		a, okA := start[k].get(series)
		b, okB := end[k].get(series)
		if !okA || !okB || b < a {
			return 0, false // a counter that went back: the node restarted
		}
		return b - a, true
	}
	addTo := func(dst *int64, v float64) {
		if *dst < 0 {
			*dst = 0
		}
		*dst += int64(v)
	}
	for k := range end {
		lc := -1
		if d, ok := delta(k, metricLeaderChanges); ok {
			lc = int(d)
			cw.LeaderChangesMetric = max(cw.LeaderChangesMetric, lc)
		}
		cw.LeaderChangesByNode = append(cw.LeaderChangesByNode, lc)
		if d, ok := delta(k, metricSnapshots); ok {
			addTo(&cw.SnapshotsTaken, d)
		}
		if d, ok := delta(k, metricSnapshotsInstalled); ok {
			addTo(&cw.SnapshotsInstalled, d)
		}
		for _, class := range priorityClasses {
			if d, ok := delta(k, fmt.Sprintf("%s{class=%q}", metricShed, class)); ok {
				if cw.ShedByClass == nil {
					cw.ShedByClass = map[string]int64{}
				}
				cw.ShedByClass[class] += int64(d)
			}
		}
	}
	return cw
}

// leaderChangesOf is the leader-change figure a table reports for a
// phase: the STATUS polls' count of new leaders, followed by the nodes'
// own count in parentheses when that differs (either may see a change
// the other misses: polls miss a leader shorter than a poll period; the
// counters miss nothing on a node that stayed up, and also count a
// follower that lost its leader for a moment and found it again, see
// ClusterWindow). "0" means both saw none.
func leaderChangesOf(ph *PhaseResult) string {
	s := fmt.Sprint(ph.LeaderChanges)
	if ph.Cluster != nil && ph.Cluster.LeaderChangesMetric >= 0 && ph.Cluster.LeaderChangesMetric != ph.LeaderChanges {
		s += fmt.Sprintf(" (%d)", ph.Cluster.LeaderChangesMetric)
	}
	return s
}
