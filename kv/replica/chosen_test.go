package replica

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRestartCommitsItsRecords: a follower whose apply loop stalls while
// it accepts a tenth of its acceptor log (notes are taken at any fill: a
// quarter full was the threshold once, and a whole-cluster restart with
// 14,000 records per node below it dueled for 3.4 s), then crashes, restarts knowing
// most of those records committed (the chosen-through note in the log's
// header, chosen.go), applies them at once and catches up; planted
// (TestingNoChosenNotes): it restarts with its commit index at its
// applied slot and every record uncommitted.
func TestRestartCommitsItsRecords(t *testing.T) {
	above, committed, line := restartWithNotes(t)
	if committed < above/2 {
		t.Fatalf("restarted with %d records above its applied slot, %d of them committed at once: %s", above, committed, line)
	}
	TestingNoChosenNotes = true
	defer func() { TestingNoChosenNotes = false }()
	pAbove, pCommitted, pLine := restartWithNotes(t)
	if pCommitted != 0 {
		t.Fatalf("planted (no notes): %d of %d records committed at the restart (%s): the test does not show the gap", pCommitted, pAbove, pLine)
	}
	fmt.Printf("restart with chosen notes: %s; planted (no notes): %s\n", line, pLine)
}

// chosenTestUsedPercent is how full node 3's log is when it crashes.
const chosenTestUsedPercent = 10

// restartWithNotes returns how many records node 3 held above its applied
// slot when it restarted, how many of them it committed at once, and a line.
func restartWithNotes(t *testing.T) (above, committed int, line string) {
	const valBytes = 64 << 10
	c := newTestClusterWith(t, func(c *testCluster) {
		c.usedPct = 101 // no usage snapshots: node 3's store never flushes before it crashes
	})
	defer c.stopAll() // the caller changes a testing knob next
	c.put("before", "1")
	if l := c.leader(); l == 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.nodes[3].r.TransferLeadership(ctx, 1)
		cancel()
		if err != nil {
			t.Fatalf("transfer from node 3: %v", err)
		}
	}
	c.nodes[3].r.faults.DelayNextApply(ApplyDelayMax)
	val := strings.Repeat("v", valBytes)
	keys := 0
	for {
		used, capacity := c.nodes[3].r.alog.Usage()
		if used*100 >= capacity*chosenTestUsedPercent {
			break
		}
		if keys > 400 {
			t.Fatalf("node 3's log holds %d of %d bytes after %d writes", used, capacity, keys)
		}
		c.put(fmt.Sprintf("s%04d", keys), val)
		keys++
	}
	// Node 3 holds and knows committed all its leader committed before
	// the next note is due: a node that lagged would note a slot midway
	// through its catch-up and could crash before the next note (CI once:
	// 63 of 92 records committed at the restart).
	commit := c.nodes[c.leader()].r.Status().Commit
	waitFor(t, "node 3 to know committed what its leader committed", func() bool {
		return c.nodes[3].r.Status().Commit >= commit
	})
	time.Sleep(chosenNoteEvery + 100*time.Millisecond) // the next note is due
	for i := 0; i < 2; i++ {
		c.put(fmt.Sprintf("s%04d", keys), val)
		keys++
	}
	// ... and has them before it crashes (a put returns on the leader's
	// and node 2's votes).
	commit = c.nodes[c.leader()].r.Status().Commit
	waitFor(t, "node 3 to know the last writes committed", func() bool {
		return c.nodes[3].r.Status().Commit >= commit
	})
	c.crash(3, nil)
	leader := c.leader(3)
	c.start(3)
	// What it recovered from its own log, not what a heartbeat that
	// came in since taught it (CI once: the planted run's Status, read
	// after Start, already held the leader's commit).
	st := c.nodes[3].recovered
	applied := st.Applied
	above = int(st.LastSlot - applied)
	committed = int(st.Commit - applied)
	line = fmt.Sprintf("writes=%d value_kib=%d restart_applied=%d records_above=%d committed_at_restart=%d",
		keys, valBytes>>10, applied, above, committed)
	c.checkCaughtUp(leader, 3, keys, valBytes)
	return above, committed, line
}
