package e2e

import (
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"
)

// followerApplyStall is the injected stall of a follower's apply loop:
// long enough for its apply queue (256 batches) to fill at the group's
// commit rate many times over, below the stuck watch's 5 s.
const followerApplyStall = 2 * time.Second

// TestFollowerApplyStallKeepsItsLoop stalls one follower's apply loop
// (POST /debug/faults delay_apply) while four writers keep the group
// committing through the leader and the other follower. The follower's
// consensus loop parks the committed batches its apply queue has no room
// for in the apply backlog (kv/replica apply_backlog.go) and goes on: its
// /status keeps moving (commit rises, loop_idle_ms stays small) while its
// applied slot stands still, its backlog gauge shows batches waiting, no
// leader changes, and once the stall ends it applies everything; every
// acknowledged write reads back. Before the backlog its loop waited for
// the apply queue once 256 batches queued: its commit froze and
// loop_idle_ms grew to the rest of the stall, which the planted run
// (SYNOD_PLANT=apply-queue-blocks) shows the same checks catch.
func TestFollowerApplyStallKeepsItsLoop(t *testing.T) {
	res := followerApplyStallRun(t, false)
	if res.appliedRose != 0 {
		t.Errorf("the follower applied %d slots during its apply stall: the stall was not taken", res.appliedRose)
	}
	if res.commitRose == 0 {
		t.Errorf("the follower's commit stood still during its apply stall: its consensus loop waited for the apply loop")
	}
	if res.idleMaxMs > followerApplyStallIdleMaxMs {
		t.Errorf("the follower's consensus loop stood still for %.0f ms during its apply stall", res.idleMaxMs)
	}
	if res.backlogMax == 0 {
		t.Errorf("no batch waited in the follower's apply backlog: the stall did not fill its apply queue, so this run shows nothing")
	}
	if res.changes != 0 {
		t.Errorf("the leader changed during a follower's apply stall: %s", res.watch)
	}
	if !res.caughtUp {
		t.Errorf("the follower did not apply through the leader's commit after its stall")
	}
	// Planted (SYNOD_PLANT=apply-queue-blocks: the loop waits for the
	// apply queue, as before the backlog), the same checks see the
	// follower's loop stand still.
	planted := followerApplyStallRun(t, true)
	caught := planted.commitRose == 0 || planted.idleMaxMs > followerApplyStallIdleMaxMs
	fmt.Printf("e2e follower apply stall: stall_ms=%d commit_rose=%d applied_rose=%d loop_idle_max_ms=%.0f backlog_max_items=%.0f leader_changes=%d caught_up=%v acked=%d lost=%d; planted (the loop waits for the apply queue): commit_rose=%d loop_idle_max_ms=%.0f caught=%v\n",
		followerApplyStall.Milliseconds(), res.commitRose, res.appliedRose, res.idleMaxMs, res.backlogMax, res.changes, res.caughtUp, res.acked, res.lost,
		planted.commitRose, planted.idleMaxMs, caught)
	if !caught {
		t.Errorf("planted: the follower's loop waited for its apply queue and the checks saw it move (commit rose %d, loop idle at most %.0f ms)", planted.commitRose, planted.idleMaxMs)
	}
}

// followerApplyStallIdleMaxMs is the longest the follower's consensus
// loop may stand still during the stall (a quarter of it).
const followerApplyStallIdleMaxMs = 500

type followerStallResult struct {
	commitRose, appliedRose uint64 // the follower's, from 0.5 s into the stall to near its end
	idleMaxMs, backlogMax   float64
	changes, acked, lost    int
	caughtUp                bool
	watch                   *leadershipWatch
}

// followerApplyStallRun runs TestFollowerApplyStallKeepsItsLoop's
// scenario once, on a planted kvnode if planted.
func followerApplyStallRun(t *testing.T, planted bool) followerStallResult {
	var c *cluster
	if planted {
		c = newClusterWith(t, 3, plantedKvnode(t), []string{"SYNOD_PLANT=apply-queue-blocks"})
	} else {
		c = newCluster(t, 3)
	}
	cl := warmClient(t, c)
	ld := c.leader()
	f := c.other(ld)
	w := watchLeadership(t, c, ld)

	var (
		stop  = make(chan struct{})
		wg    sync.WaitGroup
		mu    sync.Mutex
		acked []string
	)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("fstall%d-%d", i, j)
				ctx, cancel := ctxTimeout(killOpTimeout)
				err := cl.Put(ctx, []byte(k), []byte(k))
				cancel()
				if err == nil {
					mu.Lock()
					acked = append(acked, k)
					mu.Unlock()
				}
			}
		}(i)
	}
	time.Sleep(300 * time.Millisecond)
	c.fault(f, url.Values{"delay_apply": {followerApplyStall.String()}})
	began := time.Now()
	var (
		res                   followerStallResult
		commitEarly, commit   uint64
		appliedEarly, applied uint64
		early                 bool
	)
	for time.Since(began) < followerApplyStall-200*time.Millisecond {
		st, err := c.status(f)
		if err == nil {
			res.idleMaxMs = max(res.idleMaxMs, st.LoopIdleMs)
			if !early && time.Since(began) > 500*time.Millisecond {
				commitEarly, appliedEarly, early = st.Commit, st.Applied, true
			}
			commit, applied = st.Commit, st.Applied
		}
		res.backlogMax = max(res.backlogMax, metricValue(f, "synod_apply_backlog_items"))
		time.Sleep(statusPollEvery)
	}
	res.commitRose, res.appliedRose = commit-commitEarly, applied-appliedEarly
	time.Sleep(time.Second) // the stall ends
	close(stop)
	wg.Wait()
	res.changes, res.watch = w.stop(), w
	if planted {
		return res
	}
	lst, err := c.status(ld)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(statusPollEvery) {
		if st, err := c.status(f); err == nil && st.Applied >= lst.Commit {
			res.caughtUp = true
			break
		}
	}
	res.acked = len(acked)
	res.lost = lostSelfKeyed(t, cl, acked)
	return res
}
