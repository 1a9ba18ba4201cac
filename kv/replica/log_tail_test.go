package replica

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"synod/paxos"
)

// TestLogTailFloor: the floor keeps the newest slots whose bytes fit in
// keep, to within one sample's spacing, over a ring that wrapped; no
// sample recent enough is no floor. Slots of 1,000 bytes each, one slot
// per append, in a log of 1 MiB (a sample per 1 KiB).
func TestLogTailFloor(t *testing.T) {
	const capacity, slotBytes = 1 << 20, 1000
	var lt logTail
	if _, ok := lt.floor(capacity); ok {
		t.Fatal("an empty tail has a floor")
	}
	const slots = 5000 // ~5 MiB appended: the ring wrapped
	for s := paxos.Slot(1); s <= slots; s++ {
		lt.appended(slotBytes, s, capacity)
	}
	spacing := int64(capacity/logTailSamplesMax + slotBytes)
	for _, keep := range []int64{4 << 10, 100 << 10, 400 << 10, capacity} {
		f, ok := lt.floor(keep)
		if !ok {
			t.Fatalf("keep %d: no floor", keep)
		}
		kept := int64(slots-f+1) * slotBytes
		if kept > keep || kept < keep-spacing {
			t.Fatalf("keep %d: floor %d keeps %d bytes, want within (%d, %d]", keep, f, kept, keep-spacing, keep)
		}
	}
	if f, ok := lt.floor(slotBytes - 1); ok {
		t.Fatalf("keep below one slot's bytes: floor %d, want none", f)
	}
	// A restarted node counts nothing it recovered: the floor stays above
	// the slots its log held at the start.
	var rt logTail
	rt.start(100)
	rt.appended(slotBytes, 101, capacity)
	if f, ok := rt.floor(capacity); !ok || f != 101 {
		t.Fatalf("after a start at slot 100 and one append: floor %d %v, want 101", f, ok)
	}
	// Slots appended out of order (a new leader re-proposing lower
	// slots) never lower the floor below what was appended since.
	lt.appended(50*slotBytes, 10, capacity)
	f, _ := lt.floor(60 * slotBytes)
	if f <= 10 {
		t.Fatalf("after re-accepting slot 10: floor %d keeps everything above it", f)
	}
}

// TestCatchUpTailByBytes: with Config.CatchUpLogPercent a follower that
// missed many more slots than the tail of slots (every/4 = 5 here), but
// fewer bytes than that share of the log, catches up from the log with no
// snapshot; one that missed more bytes than the share installs a
// snapshot, and the leader's log, compacted down to the share each time
// its use reaches the 50 % that asks for a snapshot, never fills (below
// 75 % at every put: 47-52 % seen, the overshoot being the puts made
// while the snapshot's flush runs). The planted twin (the share 0: only the
// tail of slots) catches the same short outage up by snapshot, which the
// same checks see.
func TestCatchUpTailByBytes(t *testing.T) {
	const every, logBytes, pct = 20, 16 << 20, CatchUpLogPercentMax
	run := func(pct int) (snapsShort, snapsLong float64, missedShort, lagSlots int64, maxUsedPct int64) {
		c := newTestClusterOpts(t, 3, every, logBytes, 0, func(c *testCluster) { c.catchUpLogPercent = pct })
		c.put("first", "v")
		leader := c.leader()
		f := paxos.NodeID(1)
		if f == leader {
			f = 2
		}
		lr := c.nodes[leader].r
		outage := func(puts, valBytes int, tag string) (float64, int64) {
			stopped := c.nodes[f].r.Applied()
			c.stop(f)
			val := strings.Repeat("v", valBytes)
			for i := range puts {
				c.put(fmt.Sprintf("%s%05d", tag, i), val)
				used, capacity := lr.alog.Usage()
				maxUsedPct = max(maxUsedPct, used*100/capacity)
			}
			// Wait for the leader to compact past where the follower
			// stopped under the slot tail alone (every/4 slots).
			deadline := time.Now().Add(compactionWait)
			for counterValue(lr.metrics.Snapshots) == 0 || paxos.Slot(gaugeValue(lr.metrics.SnapshotSlot)) < stopped+2*every {
				if time.Now().After(deadline) {
					t.Fatalf("share %d%%: the leader took no snapshot past slot %d", pct, stopped+2*every)
				}
				c.put(tag+"-nudge", "x")
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond) // compaction follows the flush on the consensus loop
			lag := int64(lr.Applied() - stopped)
			first := lr.Status().FirstSlot
			c.start(f) // a new Replica: its Installed counts from 0
			t.Logf("share %d%% %s: follower %d stopped at %d, restarted at %d; leader %d (now %d) first slot %d, applied %d",
				pct, tag, f, stopped, c.nodes[f].r.Applied(), leader, c.leader(), first, lr.Applied())
			c.waitApplied(f, lr.Applied())
			for i := range puts {
				resp := c.do(f, getReq(fmt.Sprintf("%s%05d", tag, i), true), time.Second)
				if len(resp.Value) != valBytes {
					t.Fatalf("share %d%%: follower after catching up: %s%05d holds %d bytes", pct, tag, i, len(resp.Value))
				}
			}
			return counterValue(c.nodes[f].r.metrics.Installed), lag
		}
		// Short: 300 puts of 4 KiB, ~1.2 MiB, 8 % of the log.
		snapsShort, lagSlots = outage(300, 4<<10, "short")
		missedShort = 300 * 4 << 10
		// Long: 200 puts of 64 KiB, ~12.5 MiB, beyond the 40 % share.
		snapsLong, _ = outage(200, 64<<10, "long")
		return
	}
	short, long, missed, lag, maxUsed := run(pct)
	if short != 0 || long == 0 {
		t.Fatalf("share %d%%: snapshots installed after a %d KiB outage %v (want 0), after a 12.5 MiB one %v (want > 0)", pct, missed>>10, short, long)
	}
	if maxUsed >= 75 {
		t.Fatalf("share %d%%: the leader's log reached %d%% in use: the tail kept more than the usage that asks for a snapshot allows", pct, maxUsed)
	}
	pShort, _, _, pLag, _ := run(0)
	caught := pShort > 0
	fmt.Printf("catch-up by bytes: share_pct=%d log_mib=16 missed_kib=%d lag_slots=%d snapshots=%v long_outage_snapshots=%v max_log_used_pct=%d planted_lag_slots=%d planted_snapshots=%v caught=%v\n",
		pct, missed>>10, lag, short, long, maxUsed, pLag, pShort, caught)
	if !caught {
		t.Fatal("with only the tail of slots the short outage was caught up from the log: the check cannot fail")
	}
}
