package main

// The load scenario: a store that holds real data. --load-writers
// closed-loop writers (16) of the load tenant (uncontracted) PUT 4 KiB
// values of random bytes under unique keys until --load-gib (10 GiB) is
// acknowledged. Every --load-step-mib (1 GiB) loaded is a report row: the
// write throughput of that step in MB/s (10^6 bytes), and each node's RSS
// (/proc/PID/status), disk use (state machine directory; acceptor log
// file or raft WAL) and snapshot counters (/metrics). Then one follower
// is SIGKILLed while the writers go on, stays down --load-down (60 s),
// and is restarted; its catch-up time runs from the restart until its
// applied slot reaches the leader's commit slot as of the restart (both
// from STATUS). Goals (issue 14): throughput at the last step within 2x
// of the first step's, catch-up under 2 minutes.
//
// Nothing here gives up quietly: when no write is acknowledged for
// --load-stall the load ends as stalled (with how much was loaded), the
// follower restart still runs, and a follower that does not catch up
// within --load-catchup-max is reported as such.

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"synod/kv/client"
	"synod/kv/proto"
)

// Shape and limits of the load scenario.
const (
	// loadValueBytes is the size of every loaded value (the 4 KiB).
	loadValueBytes = 4096
	// loadPollEvery is how often the monitor looks at the writers'
	// progress and polls STATUS during the catch-up.
	loadPollEvery = 100 * time.Millisecond
	// loadRetryPause is a writer's pause after a put failed (after the
	// client's own retries) before it tries the same key again.
	loadRetryPause = 20 * time.Millisecond
	// loadStepsMax bounds the report rows (and node samples) kept.
	loadStepsMax = 4096
	// Goals (reported against, never enforced).
	loadSlowdownGoal = 2.0
	loadCatchupGoal  = 2 * time.Minute
)

// LoadResult is the load scenario's figures.
type LoadResult struct {
	TargetBytes int64  `json:"target_bytes"`
	StepBytes   int64  `json:"step_bytes"`
	ValueBytes  int    `json:"value_bytes"`
	Writers     int    `json:"writers"`
	Durability  string `json:"durability"`
	// LoadedBytes were acknowledged when the target was reached or the
	// load stalled, after Seconds of loading.
	LoadedBytes int64   `json:"loaded_bytes"`
	Seconds     float64 `json:"seconds"`
	Stalled     bool    `json:"stalled"`
	// CutOff: the load ran for --load-time-max before reaching the
	// target (it was still going: not a stall).
	CutOff    bool       `json:"cut_off"`
	StallNote string     `json:"stall_note,omitempty"`
	Steps     []LoadStep `json:"steps"`
	// FirstMBps and LastMBps are the first and the last full step's
	// throughput; Slowdown is First over Last (goal <= 2).
	FirstMBps float64 `json:"first_step_mbps"`
	LastMBps  float64 `json:"last_step_mbps"`
	Slowdown  float64 `json:"slowdown"`
	// Errors: puts that failed after the client's retries (each is tried
	// again, so no key is lost); ErrorKinds says what they were.
	Errors     int64            `json:"errors"`
	ErrorKinds map[string]int64 `json:"error_kinds,omitempty"`
	// Snapshots per node over the load (taken, installed, mean seconds
	// to take one: -1 where the node does not export it). The restarted
	// follower's figures are those of its second life.
	SnapshotsTaken     []int64   `json:"snapshots_taken"`
	SnapshotsInstalled []int64   `json:"snapshots_installed"`
	SnapshotMeanSec    []float64 `json:"snapshot_mean_seconds"`
	// Snapshot transfers per node over the load (streamed snapshots:
	// synod_snapshot_transfer_seconds; nil where no node exports it).
	Transfers []SnapshotTransfers `json:"snapshot_transfers,omitempty"`
	Restart   *FollowerRestart    `json:"restart"`
	// End is every node's footprint when the scenario ended.
	End []NodeSample `json:"end"`
	// TotalBytes: everything acknowledged, the follower's down time and
	// catch-up included.
	TotalBytes int64 `json:"total_bytes"`
}

// SnapshotTransfers is one node's snapshot transfers: how many it sent
// and received and their mean duration in seconds (-1: unknown).
type SnapshotTransfers struct {
	Sent            int64   `json:"sent"`
	SentMeanSec     float64 `json:"sent_mean_seconds"`
	Received        int64   `json:"received"`
	ReceivedMeanSec float64 `json:"received_mean_seconds"`
}

// LoadStep is one report row.
type LoadStep struct {
	LoadedBytes int64        `json:"loaded_bytes"` // at the step's end
	Seconds     float64      `json:"seconds"`      // the step's own duration
	MBps        float64      `json:"mbps"`
	Nodes       []NodeSample `json:"nodes"`
}

// FollowerRestart is the follower's down time and catch-up.
type FollowerRestart struct {
	Node        int     `json:"node"`
	DownSeconds float64 `json:"down_seconds"`
	// LoadedWhileDownBytes were acknowledged while it was down.
	LoadedWhileDownBytes int64 `json:"loaded_while_down_bytes"`
	// LeaderCommitAtRestart is the target: the commit slot of the
	// leader at that moment (LeaderAtRestart, 1-based) when the follower
	// was started again.
	LeaderCommitAtRestart uint64 `json:"leader_commit_at_restart"`
	LeaderAtRestart       int    `json:"leader_at_restart"`
	// CatchUpSeconds from the restart until the follower's applied slot
	// reached the target (-1: not within --load-catchup-max).
	CatchUpSeconds float64 `json:"catchup_seconds"`
	AppliedAtEnd   uint64  `json:"applied_at_end"`
	// LeaderView is the leader's STATUS row for the follower at the
	// restart and once caught up (acked slot, lag).
	LeaderViewAtRestart *proto.MemberStatus `json:"leader_view_at_restart,omitempty"`
	LeaderViewAtEnd     *proto.MemberStatus `json:"leader_view_at_end,omitempty"`
	// SnapshotsInstalled by the follower after its restart (-1: not
	// exported): a catch-up by snapshot shows here.
	SnapshotsInstalled int64 `json:"snapshots_installed"`
	// SnapshotReceivedSeconds: how long the snapshot transfers it
	// received after its restart took, in total (-1: not exported).
	SnapshotReceivedSeconds float64 `json:"snapshot_received_seconds"`
	// SnapshotReceivedBytes: the snapshot stream bytes it received after
	// its restart (-1: not exported); DeltaRangesKept and
	// DeltaRangesReplaced: the digest ranges of its delta transfers the
	// server kept and sent (-1: not exported).
	SnapshotReceivedBytes float64 `json:"snapshot_received_bytes"`
	DeltaRangesKept       float64 `json:"delta_ranges_kept"`
	DeltaRangesReplaced   float64 `json:"delta_ranges_replaced"`
	Note                  string  `json:"note,omitempty"`
}

// loadWriters are the closed-loop writers and what they acknowledged.
type loadWriters struct {
	acked   atomic.Int64 // bytes acknowledged
	next    atomic.Int64 // next key index
	errors  atomic.Int64
	kinds   errorKinds
	stepMu  sync.Mutex
	stepAt  []time.Time // when acked crossed each step boundary
	step    int64
	lastAck atomic.Int64 // unix nanoseconds of the last acknowledgement
}

// ack records one acknowledged value and the step boundaries it crossed.
// The count and the boundaries change under one lock, so a reader that
// sees the count reach a boundary and then calls steps sees it.
func (lw *loadWriters) ack(n int64) {
	now := time.Now()
	lw.lastAck.Store(now.UnixNano())
	lw.stepMu.Lock()
	defer lw.stepMu.Unlock()
	after := lw.acked.Add(n)
	before := after - n
	for b := before/lw.step + 1; b <= after/lw.step && len(lw.stepAt) < loadStepsMax; b++ {
		lw.stepAt = append(lw.stepAt, now)
	}
}

func (lw *loadWriters) steps() []time.Time {
	lw.stepMu.Lock()
	defer lw.stepMu.Unlock()
	return append([]time.Time(nil), lw.stepAt...)
}

// run is one writer: PUT unique keys until ctx ends; a failed put is
// tried again (same key) so that every key is loaded once.
func (lw *loadWriters) run(ctx context.Context, cl *client.Client, seed uint64) {
	value := make([]byte, loadValueBytes)
	crand.Read(value) // incompressible, as real data mostly is
	binary.BigEndian.PutUint64(value[8:], seed)
	for ctx.Err() == nil {
		k := lw.next.Add(1) - 1
		binary.BigEndian.PutUint64(value, uint64(k)) // every value differs
		key := fmt.Appendf(nil, "load-%012d", k)
		for ctx.Err() == nil {
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			err := cl.Put(octx, key, value)
			cancel()
			if err == nil {
				lw.ack(loadValueBytes)
				break
			}
			if ctx.Err() != nil {
				return
			}
			lw.errors.Add(1)
			lw.kinds.add(err)
			time.Sleep(loadRetryPause)
		}
	}
}

func runLoad(ctx context.Context, o *Options, c *cluster, lw *leaderWatch, bar *progress) (*PhaseResult, error) {
	if len(c.procs) == 0 {
		return nil, errors.New("the load scenario needs an embedded cluster (it restarts a follower)")
	}
	ph := &PhaseResult{Scenario: scenLoad}
	target := int64(o.LoadGiB * (1 << 30))
	step := int64(o.LoadStepMiB) << 20
	lr := &LoadResult{TargetBytes: target, StepBytes: step, ValueBytes: loadValueBytes, Writers: o.LoadWriters,
		Durability: c.path.Durability}
	ph.Load = lr
	cls, err := dialLoadClients(ctx, c, c.tokenFor(loadTenantToken), o.LoadWriters, client.RetriesMaxDefault)
	if err != nil {
		return nil, err
	}
	defer closeClients(cls)

	win := &window{c: c, lw: lw}
	win.open(ctx)
	startScrape := c.scrapeAll(ctx)
	writers := &loadWriters{step: step}
	writers.lastAck.Store(time.Now().UnixNano())
	wctx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for k, cl := range cls {
		wg.Add(1)
		go func() { defer wg.Done(); writers.run(wctx, cl, o.Seed+uint64(k)) }()
	}
	stop := func() { stopWriters(); wg.Wait() }

	// Loading: one row per step, until the target or a stall.
	start := time.Now()
	prev := start
	rowSteps := func() {
		for _, at := range writers.steps()[len(lr.Steps):] {
			if len(lr.Steps) >= loadStepsMax {
				break
			}
			secs := at.Sub(prev).Seconds()
			prev = at
			row := LoadStep{LoadedBytes: int64(len(lr.Steps)+1) * step, Seconds: secs,
				MBps: float64(step) / 1e6 / max(secs, 1e-9), Nodes: c.sampleNodes(c.scrapeAll(ctx))}
			lr.Steps = append(lr.Steps, row)
			logLoadStep(o, c.path.Name, row, time.Since(start))
		}
	}
	for {
		if ctx.Err() != nil {
			stop()
			return nil, ctx.Err()
		}
		rowSteps()
		acked := writers.acked.Load()
		bar.phase(min(float64(acked)/float64(target), 1) * 0.8)
		if acked >= target {
			break
		}
		if idle := time.Since(time.Unix(0, writers.lastAck.Load())); idle >= o.LoadStall {
			lr.Stalled = true
			lr.StallNote = fmt.Sprintf("nothing acknowledged for %v at %.1f MiB", idle.Round(time.Second), float64(acked)/(1<<20))
			break
		}
		if took := time.Since(start); took >= o.LoadTimeMax {
			lr.CutOff = true
			lr.StallNote = fmt.Sprintf("cut off by --load-time-max after %v at %.1f MiB", took.Round(time.Second), float64(acked)/(1<<20))
			break
		}
		time.Sleep(loadPollEvery)
	}
	// The step the target was reached in may have ended after the rows
	// above were taken and before the acknowledged count was read (the
	// smoke test's tiny load then had one row for two steps).
	rowSteps()
	lr.LoadedBytes = writers.acked.Load()
	lr.Seconds = time.Since(start).Seconds()
	if n := len(lr.Steps); n > 0 {
		lr.FirstMBps, lr.LastMBps = lr.Steps[0].MBps, lr.Steps[n-1].MBps
		if lr.LastMBps > 0 {
			lr.Slowdown = lr.FirstMBps / lr.LastMBps
		}
	}

	// A follower down while the load goes on, then its catch-up.
	lr.Restart = restartFollower(ctx, o, c, writers, bar)
	stop()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	bar.phase(1)
	lr.TotalBytes = writers.acked.Load()
	lr.Errors, lr.ErrorKinds = writers.errors.Load(), writers.kinds.snapshot()
	win.close(ctx, ph)
	follower := -1
	if lr.Restart != nil {
		follower = lr.Restart.Node
	}
	if ph.Cluster != nil {
		lr.End = ph.Cluster.Nodes
		excludeRestarted(ph.Cluster, follower)
	}
	lr.snapshotFigures(startScrape, c.scrapeAll(ctx), follower)
	ph.ThroughputOps = float64(lr.LoadedBytes/loadValueBytes) / max(lr.Seconds, 1e-9)
	ph.Done, ph.Errors, ph.ErrorKinds = lr.TotalBytes/loadValueBytes, lr.Errors, lr.ErrorKinds
	if ph.CPUSeconds > 0 && ph.Done > 0 {
		ph.CPUPer1000 = ph.CPUSeconds / float64(ph.Done) * 1000
	}
	return ph, nil
}

// logLoadStep prints a report row to stderr as it is measured (a 10 GiB
// load runs for a long time; the table comes only at the end), unless
// --quiet.
func logLoadStep(o *Options, path string, st LoadStep, since time.Duration) {
	if o.Quiet {
		return
	}
	var rss, disk []string
	for _, n := range st.Nodes {
		rss = append(rss, mib(n.RSSBytes))
		disk = append(disk, mib(n.DiskBytes()))
	}
	fmt.Fprintf(os.Stderr, "\nkvbench: load %s: %d MiB acked after %.0f s, step %.1f s, %.1f MB/s; RSS MiB %s; disk MiB %s\n",
		path, st.LoadedBytes>>20, since.Seconds(), st.Seconds, st.MBps, strings.Join(rss, " "), strings.Join(disk, " "))
}

// excludeRestarted drops the restarted node (1-based; -1: none) from a
// window's leader-change count: its counters began again at its restart,
// and a restarted node learning the leader is no change of leader.
func excludeRestarted(cw *ClusterWindow, node int) {
	if node < 1 || node > len(cw.LeaderChangesByNode) {
		return
	}
	cw.LeaderChangesByNode[node-1] = -1
	cw.LeaderChangesMetric = -1
	for _, n := range cw.LeaderChangesByNode {
		cw.LeaderChangesMetric = max(cw.LeaderChangesMetric, n)
	}
}

// snapshotFigures fills the per-node snapshot counts from the scrapes at
// the load's start and end; the restarted follower's are its end figures
// (its counters began again at the restart).
func (lr *LoadResult) snapshotFigures(start, end []metrics, restarted int) {
	for k := range end {
		counter := func(series string) float64 {
			b, okB := end[k].get(series)
			if !okB {
				return -1
			}
			if k+1 == restarted {
				return b
			}
			var a float64
			if k < len(start) {
				var okA bool
				if a, okA = start[k].get(series); !okA || a > b {
					return -1
				}
			}
			return b - a
		}
		// mean returns a histogram's count and mean over the load (-1:
		// unknown; the mean of none is unknown too).
		mean := func(name, label, value string) (int64, float64) {
			sum, n := counter(histSeries(name, "sum", label, value)), counter(histSeries(name, "count", label, value))
			switch {
			case sum < 0 || n < 0:
				return -1, -1
			case n == 0:
				return 0, -1
			}
			return int64(n), sum / n
		}
		taken, inst := counter(metricSnapshots), counter(metricSnapshotsInstalled)
		_, took := mean(metricSnapshotSeconds, "", "")
		lr.SnapshotsTaken = append(lr.SnapshotsTaken, int64(taken))
		lr.SnapshotsInstalled = append(lr.SnapshotsInstalled, int64(inst))
		lr.SnapshotMeanSec = append(lr.SnapshotMeanSec, took)
		var tr SnapshotTransfers
		tr.Sent, tr.SentMeanSec = mean(metricSnapshotTransferSeconds, "direction", "sent")
		tr.Received, tr.ReceivedMeanSec = mean(metricSnapshotTransferSeconds, "direction", "received")
		lr.Transfers = append(lr.Transfers, tr)
	}
	exported := false
	for _, tr := range lr.Transfers {
		exported = exported || tr.Sent >= 0 || tr.Received >= 0
	}
	if !exported {
		lr.Transfers = nil
	}
}

// restartFollower SIGKILLs a follower while the writers go on, restarts
// it after o.LoadDown and waits for it to catch up.
func restartFollower(ctx context.Context, o *Options, c *cluster, writers *loadWriters, bar *progress) *FollowerRestart {
	fr := &FollowerRestart{CatchUpSeconds: -1, SnapshotsInstalled: -1, SnapshotReceivedSeconds: -1,
		SnapshotReceivedBytes: -1, DeltaRangesKept: -1, DeltaRangesReplaced: -1}
	li, err := c.waitLeader(ctx, leaderWaitMax)
	if err != nil {
		fr.Note = fmt.Sprintf("no follower stopped: %v", err)
		return fr
	}
	fi := (li + 1) % len(c.procs) // a follower: the node after the leader
	fr.Node = fi + 1
	c.procMu.Lock()
	victim := c.procs[fi]
	c.procMu.Unlock()
	victim.cmd.Process.Signal(syscall.SIGKILL)
	<-victim.done
	downAt, ackedAtDown := time.Now(), writers.acked.Load()
	sleepUntil(ctx, downAt.Add(o.LoadDown), func(f float64) { bar.phase(0.8 + 0.1*f) })
	if ctx.Err() != nil {
		return fr
	}
	fr.LoadedWhileDownBytes = writers.acked.Load() - ackedAtDown

	// The target: the commit slot of the leader of the moment (it may
	// have changed while the follower was down) as the follower comes
	// back.
	lst, lnow, err := leaderStatus(ctx, c, leaderWaitMax)
	np, startErr := c.startNode(fi + 1)
	restartAt := time.Now()
	fr.DownSeconds = restartAt.Sub(downAt).Seconds()
	if startErr != nil {
		fr.Note = fmt.Sprintf("restart failed: %v", startErr)
		return fr
	}
	c.procMu.Lock()
	c.procs[fi] = np
	c.procMu.Unlock()
	if err != nil {
		fr.Note = fmt.Sprintf("the leader's commit at the restart is unknown: %v", err)
		return fr
	}
	fr.LeaderAtRestart = lnow + 1
	fr.LeaderCommitAtRestart = selfRow(lst).Commit
	fr.LeaderViewAtRestart = memberRow(lst, uint64(fi+1))

	// Catch-up: the follower's own applied slot reaches the target.
	deadline := restartAt.Add(o.LoadCatchupMax)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case <-np.done:
			fr.Note = fmt.Sprintf("the restarted follower exited: %v", np.err)
			return fr
		default:
		}
		if st, err := statusOf(ctx, c.endpoints[fi], c.monitor); err == nil {
			fr.AppliedAtEnd = selfRow(st).Applied
			if fr.AppliedAtEnd >= fr.LeaderCommitAtRestart {
				fr.CatchUpSeconds = time.Since(restartAt).Seconds()
				break
			}
		}
		bar.phase(0.9 + 0.099*time.Since(restartAt).Seconds()/o.LoadCatchupMax.Seconds())
		time.Sleep(loadPollEvery)
	}
	if fr.CatchUpSeconds < 0 && fr.Note == "" {
		fr.Note = fmt.Sprintf("not caught up within %v: applied %d of %d", o.LoadCatchupMax, fr.AppliedAtEnd, fr.LeaderCommitAtRestart)
	}
	if st, _, err := leaderStatus(ctx, c, statusTimeout); err == nil {
		fr.LeaderViewAtEnd = memberRow(st, uint64(fi+1))
	}
	if m, err := scrapeMetrics(ctx, c.admins[fi]); err == nil {
		if v, ok := m.get(metricSnapshotsInstalled); ok {
			fr.SnapshotsInstalled = int64(v)
		}
		if v, ok := m.get(histSeries(metricSnapshotTransferSeconds, "sum", "direction", "received")); ok {
			fr.SnapshotReceivedSeconds = v
		}
		if v, ok := m.get(metricSnapshotReceivedBytes); ok {
			fr.SnapshotReceivedBytes = v
		}
		if v, ok := m.get(metricDeltaRanges + `{what="kept"}`); ok {
			fr.DeltaRangesKept = v
		}
		if v, ok := m.get(metricDeltaRanges + `{what="replaced"}`); ok {
			fr.DeltaRangesReplaced = v
		}
	}
	return fr
}

// leaderStatus returns the STATUS of the node that says it leads now and
// its index, polling every node (a dead one just does not answer) for at
// most limit.
func leaderStatus(ctx context.Context, c *cluster, limit time.Duration) (*proto.ClusterStatus, int, error) {
	deadline := time.Now().Add(limit)
	for {
		for i, ep := range c.endpoints {
			if st, err := statusOf(ctx, ep, c.monitor); err == nil && st.LeaderID != 0 && st.Self == st.LeaderID {
				return st, i, nil
			}
		}
		if ctx.Err() != nil {
			return nil, -1, ctx.Err()
		}
		if time.Now().After(deadline) {
			return nil, -1, fmt.Errorf("no node says it leads within %v", limit)
		}
		time.Sleep(loadPollEvery)
	}
}

// sleepUntil sleeps until t (or ctx ends), reporting the fraction done.
func sleepUntil(ctx context.Context, t time.Time, progress func(float64)) {
	start := time.Now()
	total := t.Sub(start)
	for {
		left := time.Until(t)
		if left <= 0 || ctx.Err() != nil {
			return
		}
		if total > 0 {
			progress(float64(time.Since(start)) / float64(total))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(left, loadPollEvery)):
		}
	}
}

// selfRow is the answering node's own row of a STATUS reply (zero if it
// lists none).
func selfRow(st *proto.ClusterStatus) proto.MemberStatus {
	if m := memberRow(st, st.Self); m != nil {
		return *m
	}
	return proto.MemberStatus{}
}

func memberRow(st *proto.ClusterStatus, id uint64) *proto.MemberStatus {
	for i := range st.Members {
		if st.Members[i].ID == id {
			m := st.Members[i]
			return &m
		}
	}
	return nil
}
