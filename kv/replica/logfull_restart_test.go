package replica

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/paxos"
)

// TestRestartedFullLogCatchesUp is the e2e wedge of paxos logroom.go in
// one process. Node 3, a follower with a small acceptor log, accepts most
// of a log's worth of entries while its apply loop is stalled, then
// crashes: restarted, it finds every one of those records above its
// applied slot, committed but not known to be; meanwhile leadership moved
// to another node under a new ballot. Node 3 must catch up without its
// consensus loop stalling on the full log. (Its own re-proposals, as
// leader, would be re-ballots, a record header each: paxos reballot.go;
// stored whole, as before re-ballots, they would not fit, and Campaign
// says ErrNoLogRoom: the second run checks that.)
//
// The new leader holds those entries under the ballot node 3 accepted them
// under, so its catch-ups store nothing new on node 3 (paxos
// chosen_prefix.go). The admission of catch-ups is for those that do store
// (values node 3 holds under another ballot, or lacks): the second run
// makes every catch-up store its values again, whole
// (paxos.TestingReproposeChosen and TestingNoReballot, the behaviour
// before both), and they are admitted only as far as the log has
// room, the rest waiting while what was taken commits, applies and is
// truncated. Planted on top (testingCatchupsSkipAdmission): a catch-up that
// does not fit stalls node 3's loop (here it recovers, as the catch-ups it
// took before apply and truncate; as a leader re-proposing entries that
// cannot commit, the e2e node never did).
func TestRestartedFullLogCatchesUp(t *testing.T) {
	caughtUp, stalls, line := restartedFullLog(t, 60, 30*time.Second)
	if !caughtUp || stalls != 0 {
		t.Fatalf("node 3 caught up %v, its loop stalled %d times on its full log: %s", caughtUp, stalls, line)
	}
	paxos.TestingReproposeChosen, paxos.TestingNoReballot = true, true
	defer func() { paxos.TestingReproposeChosen, paxos.TestingNoReballot = false, false }()
	cCaughtUp, cStalls, cLine := restartedFullLog(t, 60, 30*time.Second)
	if !cCaughtUp || cStalls != 0 {
		t.Fatalf("catch-ups storing copies: node 3 caught up %v, its loop stalled %d times on its full log: %s", cCaughtUp, cStalls, cLine)
	}
	testingCatchupsSkipAdmission = true
	defer func() { testingCatchupsSkipAdmission = false }()
	_, pStalls, pLine := restartedFullLog(t, 60, 30*time.Second)
	if pStalls == 0 {
		t.Fatalf("planted (catch-ups storing copies skip admission): node 3's loop never stalled (%s): the test does not show the stall", pLine)
	}
	fmt.Printf("restarted full log: %s stalls=0; catch-ups storing copies: %s stalls=0; planted (and skipping admission): stalls=%d\n", line, cLine, pStalls)
}

// TestRestartedFullLogIdleCatchesUp: the same, with node 3's log filled to
// the line admission keeps (75 %) and no write after the restart. Its
// catch-ups store nothing (paxos chosen_prefix.go), so it catches up at
// once. When they store copies, whole (paxos.TestingReproposeChosen and
// TestingNoReballot), none fits
// at all and the leader, idle, never compacts past node 3: only the
// snapshot offer of a catch-up that stood still (paxos catchup_stuck.go)
// brings it up. Planted on top (paxos.TestingNoStuckCatchupOffer): it stays
// behind.
func TestRestartedFullLogIdleCatchesUp(t *testing.T) {
	caughtUp, _, line := restartedFullLog(t, 74, 30*time.Second)
	if !caughtUp {
		t.Fatalf("node 3 did not catch up: %s", line)
	}
	paxos.TestingReproposeChosen, paxos.TestingNoReballot = true, true
	defer func() { paxos.TestingReproposeChosen, paxos.TestingNoReballot = false, false }()
	cCaughtUp, _, cLine := restartedFullLog(t, 74, 30*time.Second)
	if !cCaughtUp || !strings.Contains(cLine, "snapshots_installed=1") {
		t.Fatalf("catch-ups storing copies: node 3 did not catch up by the stuck catch-up's snapshot: %s", cLine)
	}
	paxos.TestingNoStuckCatchupOffer = true
	defer func() { paxos.TestingNoStuckCatchupOffer = false }()
	pCaughtUp, _, pLine := restartedFullLog(t, 74, 10*time.Second)
	if pCaughtUp {
		t.Fatalf("planted (no offer for a stuck catch-up): node 3 caught up (%s): the test does not show the gap", pLine)
	}
	fmt.Printf("restarted full log idle: %s; catch-ups storing copies: %s; planted (and no offer for a stuck catch-up): %s\n", line, cLine, pLine)
}

// fillPut is put for the fill: node 3 must not lead while its apply is
// held back (it would commit and never answer), but on a loaded machine it
// can win an election during the fill (CI once: "put s0063 never
// succeeded" with node 3 leading, stuck on apply), so leadership is handed
// back to another node whenever node 3 holds it.
func fillPut(c *testCluster, key, val string) {
	c.t.Helper()
	req := putReq(key, val)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		l := c.leader()
		if l == 3 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := c.nodes[3].r.TransferLeadership(ctx, 1)
			cancel()
			if err != nil {
				c.t.Logf("fill: node 3 leads and did not hand over: %v", err)
			}
			continue
		}
		if resp := c.do(l, req, 2*time.Second); resp.Status == proto.StatusOK {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.t.Fatalf("put %s never succeeded (leader %d)", key, c.leader())
}

// restartedFullLog runs the scenario, node 3's log filled to fillPct of
// its capacity, and reports whether node 3 caught up within wait, how
// often its loop stalled on its log, and a line describing it.
func restartedFullLog(t *testing.T, fillPct int64, wait time.Duration) (caughtUp bool, stalls int, line string) {
	const valBytes = 64 << 10
	const capBytes = AcceptorLogBytesMin
	c := newTestClusterWith(t, func(c *testCluster) {
		c.usedPct = 101 // no usage snapshots: node 3's store never flushes before it crashes
		c.wrapLog = func(id paxos.NodeID, l AcceptorLog) AcceptorLog {
			if id == 3 {
				return cappedLog{AcceptorLog: l, capBytes: capBytes}
			}
			return l
		}
	})
	defer c.stopAll() // the callers change paxos's testing knobs next
	c.put("before", "1")
	leader := c.leader()
	if leader == 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.nodes[3].r.TransferLeadership(ctx, 1)
		cancel()
		if err != nil {
			t.Fatalf("transfer from node 3: %v", err)
		}
		leader = c.leader()
	}
	c.nodes[3].r.faults.DelayNextApply(ApplyDelayMax)
	val := strings.Repeat("v", valBytes)
	keys := 0
	for {
		used, _ := c.nodes[3].r.alog.Usage()
		if used*100 >= capBytes*fillPct || counterValue(c.nodes[3].r.metrics.LogFull) > 0 {
			break // filled, or admission started dropping
		}
		if keys > 200 {
			t.Fatalf("node 3's log holds %d of %d bytes after %d writes", used, capBytes, keys)
		}
		fillPut(c, fmt.Sprintf("s%04d", keys), val)
		keys++
	}
	c.crash(3, nil)
	other := paxos.NodeID(3 - leader) // the leader is 1 or 2
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := c.nodes[leader].r.TransferLeadership(ctx, other)
	cancel()
	if err != nil {
		t.Fatalf("transfer from node %d to %d: %v", leader, other, err)
	}
	leader = other
	c.put("after", "1") // under the new ballot
	c.start(3)
	r3 := c.nodes[3].r
	st := c.nodes[3].recovered // from its own log, before a heartbeat could raise its commit
	used, _ := r3.alog.Usage()
	line = fmt.Sprintf("writes=%d value_kib=%d restart_applied=%d records_above=%d log_bytes=%d/%d",
		keys, valBytes>>10, r3.Applied(), st.LastSlot-st.Commit, used, capBytes)
	if st.LastSlot <= st.Commit+paxos.Slot(keys/2) {
		t.Fatalf("%s: the restart did not leave node 3 with its records uncommitted", line)
	}
	if paxos.TestingNoReballot {
		// Its re-proposals, stored whole, do not fit: it defers.
		campaign := make(chan error, 1)
		r3.controlC <- func() { campaign <- r3.node.Campaign() }
		if err := <-campaign; !errors.Is(err, paxos.ErrNoLogRoom) {
			t.Fatalf("%s: Campaign on node 3: %v, want ErrNoLogRoom", line, err)
		}
	}
	target := c.nodes[leader].r.Applied()
	deadline := time.Now().Add(wait)
	for r3.Applied() < target {
		if time.Now().After(deadline) {
			return false, int(counterValue(r3.metrics.LogStalls)), fmt.Sprintf("%s not_caught_up_after=%v applied=%d/%d leader=%d", line, wait, r3.Applied(), target, leader)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.checkCaughtUp(leader, 3, keys, valBytes)
	return true, int(counterValue(r3.metrics.LogStalls)), fmt.Sprintf("%s caught_up_to=%d after=%v elections_deferred=%d snapshots_installed=%v",
		line, target, time.Since(deadline.Add(-wait)).Round(time.Millisecond), r3.Status().ElectionsDeferred, counterValue(r3.metrics.Installed))
}
