package replica

import (
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"synod/kv/proto"
	"synod/kv/sm"
	"synod/paxos"
)

// withChunkBytes makes transfers use n-byte chunks until the returned
// function runs.
func withChunkBytes(n int) func() {
	old := snapshotChunkBytes
	snapshotChunkBytes = n
	return func() { snapshotChunkBytes = old }
}

// crash stops node id as a crash would for its state machine (no flush;
// an open staging is left as it is) and closes its runtime.
func (c *testCluster) crash(id paxos.NodeID, beforeClose func()) {
	n := c.nodes[id]
	n.sm.Abandon()
	if beforeClose != nil {
		beforeClose()
	}
	n.r.Close()
}

// laggingFollower stops a follower, writes keys keys of valBytes through
// the leader until it compacted past every slot the follower holds, and
// returns both.
func laggingFollower(c *testCluster, keys, valBytes int) (leader, follower paxos.NodeID) {
	c.t.Helper()
	c.put("before", "1")
	leader = c.leader()
	follower = paxos.NodeID(1)
	if follower == leader {
		follower = 2
	}
	c.stop(follower)
	// The follower restarts with every entry its acceptor log holds, which
	// may run past what it applied: the leader must have compacted past
	// the last of them, or the restart catches up from the log.
	held := max(c.nodes[follower].r.Applied(), c.nodes[follower].r.Status().LastSlot)
	val := strings.Repeat("v", valBytes)
	for i := 0; i < keys; i++ {
		c.put(fmt.Sprintf("s%04d", i), val)
	}
	// A transfer the leader served earlier (to a follower that fell
	// behind on a loaded machine) pins its log for snapshotRetainAfter.
	deadline := time.Now().Add(snapshotRetainAfter + 20*time.Second)
	for c.nodes[leader].r.Status().FirstSlot <= held+1 {
		if time.Now().After(deadline) {
			c.t.Fatalf("the leader did not compact past the stopped follower (first slot %d)", c.nodes[leader].r.Status().FirstSlot)
		}
		c.put("nudge", "x")
		time.Sleep(5 * time.Millisecond)
	}
	return leader, follower
}

// checkCaughtUp waits until follower applied what leader applied and holds
// every key laggingFollower wrote.
func (c *testCluster) checkCaughtUp(leader, follower paxos.NodeID, keys, valBytes int) {
	c.t.Helper()
	c.waitApplied(follower, c.nodes[leader].r.Applied())
	for i := 0; i < keys; i++ {
		resp := c.do(follower, getReq(fmt.Sprintf("s%04d", i), true), time.Second)
		if resp.Status != proto.StatusOK || len(resp.Value) != valBytes {
			c.t.Fatalf("follower %d after catching up: s%04d %v (%d bytes)", follower, i, resp.Status, len(resp.Value))
		}
	}
}

// TestSnapshotInstallCrashAtEveryChunk crashes a follower fetching a
// snapshot (authenticated transfers, 4 KiB chunks) at every chunk
// boundary in turn, restarting it each time, then once more after the
// staged copy is complete and before paxos hears of it: every restart
// opens (a partial staging is discarded, the complete one is swapped in),
// asks for the transfer again, and the node finally holds everything. It
// runs for whole transfers and for delta ones (the follower holds a key
// from before it stopped, so it asks for a delta; a delta's chunks follow
// the server's hashing, so the boundaries are walked until a transfer
// completes without reaching the next one).
func TestSnapshotInstallCrashAtEveryChunk(t *testing.T) {
	for _, whole := range []bool{true, false} {
		t.Run(map[bool]string{true: "whole", false: "delta"}[whole], func(t *testing.T) {
			crashAtEveryChunk(t, whole)
		})
	}
}

func crashAtEveryChunk(t *testing.T, whole bool) {
	defer withChunkBytes(4 << 10)()
	const keys, valBytes = 150, 300
	c := newTestClusterWith(t, func(c *testCluster) { c.snapEvery = 20; c.secret = secretA; c.deltaSnapshots = !whole })
	leader, f := laggingFollower(c, keys, valBytes)

	// No writes from here on: every transfer serves the same state.
	rc, _, err := c.nodes[leader].sm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	size, err := io.Copy(io.Discard, rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	chunks := uint64((size + int64(snapshotChunkBytes) - 1) / int64(snapshotChunkBytes))
	if chunks < 8 {
		t.Fatalf("a %d-byte snapshot is only %d chunks: too few boundaries", size, chunks)
	}

	var crashAt atomic.Uint64
	var armed atomic.Bool // disarmed, not cleared, while the cluster runs: its loops read the hook
	armed.Store(true)
	hit, release := make(chan uint64), make(chan struct{})
	TestingSnapshotChunkHook = func(node paxos.NodeID, seq uint64) {
		if armed.Load() && node == f && (seq == crashAt.Load() || seq == snapHookStaged) {
			hit <- seq
			<-release
		}
	}
	defer func() { c.stopAll(); TestingSnapshotChunkHook = nil }() // the cluster first: its loops read the hook
	crashed := uint64(0)
	for at := uint64(1); ; at++ {
		crashAt.Store(at)
		c.start(f)
		var got uint64
		select {
		case got = <-hit:
		case <-time.After(30 * time.Second):
			t.Fatalf("no transfer reached crash point %d (whole stream: %d chunks)", at, chunks)
		}
		c.crash(f, func() { release <- struct{}{} })
		if got == snapHookStaged {
			break // the transfer has fewer chunks than at: staged, crashed
		}
		crashed++
	}
	if whole && crashed != chunks {
		t.Fatalf("crashed at %d chunk boundaries of a %d-chunk whole transfer", crashed, chunks)
	}
	if crashed < 8 {
		t.Fatalf("crashed at only %d chunk boundaries", crashed)
	}
	crashAt.Store(0)
	armed.Store(false)
	c.start(f)
	// The state machine swapped the complete staged copy in when it
	// opened: the node starts at the leader's slot, without a transfer.
	if got, want := c.nodes[f].r.Applied(), c.nodes[leader].r.Applied(); got != want {
		t.Fatalf("after the crash between staging and install (after %d chunk crashes), the node starts at slot %d, want the staged %d", crashed, got, want)
	}
	c.checkCaughtUp(leader, f, keys, valBytes)
	if n := counterValue(c.nodes[f].r.metrics.Snap.Transfers.WithLabelValues(dirReceived, resultOK)); n != 0 {
		t.Fatalf("the last restart fetched %v snapshots: the staged one was not used", n)
	}
	t.Logf("whole=%v: crashed at each of %d chunk boundaries and after staging; caught up at slot %d", whole, crashed, c.nodes[f].r.Applied())
	if got := counterValue(c.nodes[leader].r.metrics.Snap.SentBytes); got == 0 {
		t.Fatal("the leader counts no snapshot bytes sent")
	}
}

// TestDeltaCatchUpSendsWhatChanged: a follower stopped while 60 keys were
// written above 300 it holds catches up by a delta transfer (it holds
// state) that keeps most of its ranges and receives less than half the
// state's bytes; its twin without Config.DeltaSnapshots (kvnode's default,
// snapshot_transfer = "whole") receives all of them.
func TestDeltaCatchUpSendsWhatChanged(t *testing.T) {
	defer sm.TestingDeltaRangeBytes(16 << 10)()
	const oldKeys, keys, valBytes = 300, 60, 1000
	run := func(delta bool) (received, kept, replaced float64) {
		c := newTestClusterWith(t, func(c *testCluster) { c.snapEvery = 20; c.secret = secretA; c.deltaSnapshots = delta })
		for i := range oldKeys {
			c.put(fmt.Sprintf("a%04d", i), strings.Repeat("o", valBytes))
		}
		leader, f := laggingFollower(c, keys, valBytes)
		c.start(f)
		c.checkCaughtUp(leader, f, keys, valBytes)
		for i := range oldKeys {
			if resp := c.do(f, getReq(fmt.Sprintf("a%04d", i), true), time.Second); resp.Status != proto.StatusOK || len(resp.Value) != valBytes {
				t.Fatalf("delta %v: a%04d on the follower: %v", delta, i, resp.Status)
			}
		}
		m := &c.nodes[f].r.metrics.Snap
		if counterValue(c.nodes[f].r.metrics.Installed) < 1 {
			t.Fatalf("delta %v: the follower caught up without a snapshot: the test needs one", delta)
		}
		// The fetcher counts a transfer after its install returns, so the
		// follower can serve everything before its counters are in (seen
		// on a loaded machine: kept=0 replaced=0 after a delta).
		for deadline := time.Now().Add(10 * time.Second); counterValue(m.Transfers.WithLabelValues(dirReceived, resultOK)) < 1; {
			if time.Now().After(deadline) {
				t.Fatalf("delta %v: the follower installed a snapshot but counts no transfer received", delta)
			}
			time.Sleep(time.Millisecond)
		}
		return counterValue(m.ReceivedBytes), counterValue(m.DeltaRanges.WithLabelValues(rangesKept)), counterValue(m.DeltaRanges.WithLabelValues(rangesReplaced))
	}
	received, kept, replaced := run(true)
	whole, wholeKept, _ := run(false)
	fmt.Printf("delta catch-up: received_bytes=%.0f kept_ranges=%.0f replaced_ranges=%.0f whole_received_bytes=%.0f\n", received, kept, replaced, whole)
	if kept == 0 || kept < replaced || wholeKept != 0 {
		t.Fatalf("kept %v ranges, replaced %v (the whole run kept %v): want most kept", kept, replaced, wholeKept)
	}
	if whole < oldKeys*valBytes || received*2 > whole {
		t.Fatalf("the delta received %v bytes, the whole transfer %v (state >= %d)", received, whole, oldKeys*valBytes)
	}
}

// TestSnapshotTransferMetrics: a catch-up by snapshot counts bytes on
// both sides, ends with nothing in flight, and records one successful
// transfer each way.
func TestSnapshotTransferMetrics(t *testing.T) {
	defer withChunkBytes(8 << 10)()
	c := newTestClusterWith(t, func(c *testCluster) { c.snapEvery = 20; c.secret = secretA })
	leader, f := laggingFollower(c, 80, 500)
	c.start(f)
	c.checkCaughtUp(leader, f, 80, 500)
	// Both ends count a transfer when their own goroutine finishes it,
	// which may be just after the follower's applied slot caught up: the
	// counts are awaited, not sampled once.
	fm := &c.nodes[f].r.metrics.Snap
	deadline := time.Now().Add(10 * time.Second)
	for {
		var sentOK float64
		for _, n := range c.nodes {
			sentOK += counterValue(n.r.metrics.Snap.Transfers.WithLabelValues(dirSent, resultOK))
		}
		receivedOK := counterValue(fm.Transfers.WithLabelValues(dirReceived, resultOK))
		if sentOK > 0 && receivedOK > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("transfers counted ok: sent %v, received %v; want both > 0", sentOK, receivedOK)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := counterValue(fm.ReceivedBytes); got < 80*500 {
		t.Fatalf("received %v snapshot bytes, want at least the %d bytes of values", got, 80*500)
	}
	if got := counterValue(fm.Transfers.WithLabelValues(dirReceived, resultOK)); got != 1 {
		t.Fatalf("%v received transfers ok, want 1", got)
	}
	var g dto.Metric
	fm.InFlight.WithLabelValues(dirReceived).Write(&g)
	if g.GetGauge().GetValue() != 0 {
		t.Fatalf("%v transfers still in flight", g.GetGauge().GetValue())
	}
	if counterValue(c.nodes[f].r.metrics.Installed) != 1 {
		t.Fatal("the follower installed no snapshot")
	}
}

// countingSM counts the snapshot streams a node's state machine opens.
type countingSM struct {
	*sm.SM
	streams *atomic.Int64
}

func (s countingSM) Snapshot() (io.ReadCloser, uint64, error) {
	s.streams.Add(1)
	return s.SM.Snapshot()
}

func (s countingSM) SnapshotDelta(digest []byte) (io.ReadCloser, uint64, error) {
	s.streams.Add(1)
	return s.SM.SnapshotDelta(digest)
}

// TestCompactionReadsNoState: compaction (every 20 slots here) opens no
// snapshot stream on any node, so taking a snapshot reads no state on the
// apply loop whatever the store's size (snapshot_compact.go); a stream is
// opened only to serve a lagging peer, which the same counter sees (the
// check can fail).
// compactionWait bounds how long a test waits for a compaction whose
// Pebble flush runs in the background.
const compactionWait = 20 * time.Second

func TestCompactionReadsNoState(t *testing.T) {
	streams := map[paxos.NodeID]*atomic.Int64{1: {}, 2: {}, 3: {}}
	c := newTestClusterWith(t, func(c *testCluster) {
		c.snapEvery = 20
		c.wrapSM = func(id paxos.NodeID, s *sm.SM) StateMachine { return countingSM{SM: s, streams: streams[id]} }
	})
	for i := 0; i < 150; i++ {
		c.put(fmt.Sprintf("k%03d", i), "v")
		// Every node applies each put before the next: a follower that
		// fell more than snapEvery slots behind on a loaded machine would
		// be caught up by a snapshot stream (a leader compacts through its
		// own snapshot), which this test must not count as compaction's.
		lead := c.leader()
		for id := range c.nodes {
			c.waitApplied(id, c.nodes[lead].r.Applied())
		}
	}
	total := func() (n int64) {
		for _, s := range streams {
			n += s.Load()
		}
		return n
	}
	for id, n := range c.nodes {
		c.waitApplied(id, c.nodes[c.leader()].r.Applied())
		// Compaction finishes after an asynchronous Pebble flush
		// (snapshot_compact.go), so it is awaited, not sampled once.
		compactedNode := func() bool {
			return counterValue(n.r.metrics.Snapshots) > 0 && n.r.Status().FirstSlot > 1
		}
		deadline := time.Now().Add(compactionWait)
		for !compactedNode() {
			if time.Now().After(deadline) {
				t.Fatalf("node %d took no snapshot or did not compact within %v (snapshots %v, first slot %d)",
					id, compactionWait, counterValue(n.r.metrics.Snapshots), n.r.Status().FirstSlot)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if n := total(); n != 0 {
		t.Fatalf("compaction opened %d snapshot streams", n)
	}
	// A laggard is served from a stream, and the counter sees it.
	leader, f := laggingFollower(c, 60, 100)
	c.start(f)
	c.checkCaughtUp(leader, f, 60, 100)
	if total() == 0 {
		t.Fatal("catching a follower up by snapshot opened no stream: the counter sees nothing")
	}
}

// TestCatchUpTailServesShortLag: a follower stopped a few slots before the
// leader's next compaction (fewer than the catch-up tail, every/4) finds
// the log kept below the snapshot and catches up from it, with no
// snapshot. The planted twin (testingNoCatchUpTail) compacts through the
// snapshot as before: the log is gone below the follower and it installs
// a snapshot, which the same checks see.
func TestCatchUpTailServesShortLag(t *testing.T) {
	const every = 80
	kept, installed, lag := shortLagCatchUp(t, every, false)
	if !kept || installed != 0 {
		t.Fatalf("lag of %d slots (tail %d): log kept %v, snapshots installed %v; want the log kept and none", lag, every/catchUpTailDivisor, kept, installed)
	}
	testingNoCatchUpTail = true
	defer func() { testingNoCatchUpTail = false }()
	pKept, pInstalled, pLag := shortLagCatchUp(t, every, true)
	caught := !pKept && pInstalled > 0
	fmt.Printf("catch-up tail: tail_slots=%d lag_slots=%d kept_log=%v installed=%v planted_lag_slots=%d planted_kept_log=%v planted_installed=%v caught=%v\n",
		every/catchUpTailDivisor, lag, kept, installed, pLag, pKept, pInstalled, caught)
	if !caught {
		t.Fatalf("without the tail the log was kept (%v) or no snapshot installed (%v): the check cannot fail", pKept, pInstalled)
	}
}

// shortLagCatchUp stops a follower 4 slots before the leader's next
// compaction, writes past it, and reports whether the leader's log still
// reached down to the follower once it compacted, how many snapshots the
// follower installed to catch up, and its lag at the compaction.
func shortLagCatchUp(t *testing.T, every uint64, planted bool) (kept bool, installed float64, lag uint64) {
	c := newTestClusterWith(t, func(c *testCluster) { c.snapEvery = every; c.secret = secretA })
	defer c.stopAll() // the caller changes a testing knob next
	putAll := func(k string) {
		c.put(k, "v")
		lead := c.leader()
		for id := range c.nodes {
			c.waitApplied(id, c.nodes[lead].r.Applied())
		}
	}
	putAll("first")
	leader := c.leader()
	f := paxos.NodeID(1)
	if f == leader {
		f = 2
	}
	lr := c.nodes[leader].r
	snapSlot := func() uint64 {
		var m dto.Metric
		lr.metrics.SnapshotSlot.Write(&m)
		return uint64(m.GetGauge().GetValue())
	}
	// Wait for a compaction so the next one's slot is known.
	for i := 0; counterValue(lr.metrics.Snapshots) == 0; i++ {
		putAll(fmt.Sprintf("a%04d", i))
	}
	next := snapSlot() + every
	for i := 0; uint64(lr.Applied()) < next-4; i++ {
		putAll(fmt.Sprintf("b%04d", i))
	}
	stopped := uint64(c.nodes[f].r.Applied())
	c.stop(f)
	before := counterValue(lr.metrics.Snapshots)
	firstBefore := lr.Status().FirstSlot
	// Write up to the snapshot's slot, then wait for its flush without
	// writing more: more writes during a slow flush would make the next
	// snapshot, far past the tail.
	for i := 0; uint64(lr.Applied()) < next; i++ {
		c.put(fmt.Sprintf("c%04d", i), "v")
	}
	deadline := time.Now().Add(compactionWait)
	for counterValue(lr.metrics.Snapshots) == before {
		if time.Now().After(deadline) {
			t.Fatalf("planted=%v: the leader took no snapshot past slot %d", planted, next)
		}
		time.Sleep(5 * time.Millisecond)
	}
	lag = snapSlot() - stopped
	// Compaction follows the snapshot's flush on the consensus loop (the
	// counter moves before it is queued there): wait for the log's first
	// slot to move, which it does with the tail and without; if it never
	// does, the check below judges the log as it stands.
	deadline = time.Now().Add(compactionWait)
	for lr.Status().FirstSlot == firstBefore && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	kept = uint64(lr.Status().FirstSlot) <= stopped+1
	c.start(f)
	c.waitApplied(f, lr.Applied())
	return kept, counterValue(c.nodes[f].r.metrics.Installed), lag
}
