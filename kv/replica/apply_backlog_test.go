package replica

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/proto"
	"synod/paxos"
)

// backlogReplica is a Replica with only what toApply and the backlog use:
// an apply queue of queueCap items and a leader's status.
func backlogReplica(queueCap int) *Replica {
	r := &Replica{log: zerolog.Nop(), metrics: NewMetrics(nil), applyC: make(chan applyItem, queueCap), stop: make(chan struct{})}
	r.status.Store(&paxos.Status{Role: paxos.RoleLeader})
	return r
}

// slotItem is an apply item of one command entry of n bytes at slot s.
func slotItem(s paxos.Slot, n int) applyItem {
	return applyItem{entries: []paxos.Entry{{Slot: s, Type: paxos.EntryNormal, Cmds: [][]byte{make([]byte, n)}}}}
}

// installItem is a snapshot install at slot s (never merged).
func installItem(s paxos.Slot) applyItem {
	return applyItem{install: &paxos.SnapshotMeta{Slot: s}}
}

// slotItemOverheadBytes is what itemBytes counts for slotItem(s, n)
// beyond its n bytes.
const slotItemOverheadBytes = int(applyBacklogEntryBytes + applyBacklogCmdBytes)

// queueTaker receives from r's apply queue and records the slots it got,
// entry by entry (an install as its slot).
type queueTaker struct {
	r   *Replica
	got []paxos.Slot
}

func (q *queueTaker) take() {
	it := <-q.r.applyC
	if it.install != nil {
		q.got = append(q.got, it.install.Slot)
		return
	}
	for _, e := range it.entries {
		q.got = append(q.got, e.Slot)
	}
}

// TestApplyBacklogOrderAndBounds holds the backlog to its contract
// (apply_backlog.go): the consensus loop never waits while the backlog
// has room, slots reach the apply queue in order whichever path they
// take, consecutive batches merge into one item (an install stands
// alone), a leader holds new writes past half of either bound, and a
// full backlog (items or bytes) waits for the apply queue, in order.
func TestApplyBacklogOrderAndBounds(t *testing.T) {
	if got := backlogOrder(t); !inOrder(got, 6) {
		t.Fatalf("the apply queue received slots %v, want 1..6 in order", got)
	}
	testingBacklogOvertaken = true
	planted := backlogOrder(t)
	testingBacklogOvertaken = false
	if inOrder(planted, 6) {
		t.Fatalf("planted (a batch overtakes the backlog): the apply queue still received %v in order; the check cannot see it", planted)
	}

	// The hold line by items (installs, which do not merge); crossing
	// back releases it; a follower never holds.
	r := backlogReplica(1)
	r.toApply(installItem(1), 1) // the queue
	for s := paxos.Slot(2); s <= applyBacklogHoldBatches; s++ {
		r.toApply(installItem(s), s)
	}
	if r.applyBacklogHolds() {
		t.Fatalf("leader holds writes with %d items waiting, below the line %d", r.applyBacklog.waiting.Load(), applyBacklogHoldBatches)
	}
	r.toApply(installItem(applyBacklogHoldBatches+1), applyBacklogHoldBatches+1)
	if !r.applyBacklogHolds() || counterValue(r.metrics.ApplyBacklogHolds) != 1 {
		t.Fatalf("leader takes writes with %d items waiting (line %d)", r.applyBacklog.waiting.Load(), applyBacklogHoldBatches)
	}
	<-r.applyC
	r.drainApplyBacklog()
	if r.applyBacklogHolds() {
		t.Fatal("leader still holds writes below the line")
	}
	r.status.Store(&paxos.Status{Role: paxos.RoleFollower})
	for s := paxos.Slot(applyBacklogHoldBatches + 2); s < applyBacklogBatchesMax; s++ {
		r.toApply(installItem(s), s)
	}
	if r.holdProposals() {
		t.Fatal("a follower holds writes: it has none to hold, and must take them to refuse them")
	}

	// The hold line by bytes; batches merge into one item.
	r = backlogReplica(1)
	r.toApply(slotItem(1, 1), 1) // the queue
	r.toApply(slotItem(2, applyBacklogHoldBytes-2*slotItemOverheadBytes-1), 2)
	if r.applyBacklogHolds() {
		t.Fatalf("leader holds writes with %d bytes waiting, below the byte line %d", r.applyBacklog.bytes, applyBacklogHoldBytes)
	}
	r.toApply(slotItem(3, 1), 3)
	if !r.applyBacklogHolds() || r.applyBacklog.bytes != applyBacklogHoldBytes {
		t.Fatalf("leader takes writes with %d bytes waiting (line %d)", r.applyBacklog.bytes, applyBacklogHoldBytes)
	}
	if n := r.applyBacklog.waiting.Load(); n != 1 {
		t.Fatalf("slots 2 and 3 wait in %d items, want 1 (merged)", n)
	}

	// Full by bytes: the next batch waits for the apply queue, and the
	// backlog goes first.
	r.toApply(slotItem(4, applyBacklogBytesMax-int(r.applyBacklog.bytes)-slotItemOverheadBytes), 4) // exactly full
	if r.applyBacklog.bytes != applyBacklogBytesMax {
		t.Fatalf("backlog holds %d bytes, want exactly %d", r.applyBacklog.bytes, applyBacklogBytesMax)
	}
	done := make(chan bool)
	go func() { done <- r.toApply(slotItem(5, 1), 5) }()
	select {
	case <-done:
		t.Fatal("a batch past the byte bound was taken without waiting")
	case <-time.After(50 * time.Millisecond):
	}
	q := &queueTaker{r: r}
	for len(q.got) < 5 {
		q.take()
	}
	if ok := <-done; !ok {
		t.Fatal("toApply stopped")
	}
	if !inOrder(q.got, 5) {
		t.Fatalf("past the byte bound the apply queue received %v, want 1..5", q.got)
	}

	// A merged item holds at most applyBacklogMergeEntriesMax entries.
	r = backlogReplica(1)
	for s := paxos.Slot(1); s <= applyBacklogMergeEntriesMax+2; s++ {
		r.toApply(slotItem(s, 1), s)
	}
	if n := r.applyBacklog.waiting.Load(); n != 2 || len(r.applyBacklog.items[0].it.entries) != applyBacklogMergeEntriesMax {
		t.Fatalf("%d batches of one slot after the queue's: %d items, the first of %d entries; want 2, %d",
			applyBacklogMergeEntriesMax+1, n, len(r.applyBacklog.items[0].it.entries), applyBacklogMergeEntriesMax)
	}

	// Full by items: the same, and a stop ends the wait.
	r = backlogReplica(1)
	for s := paxos.Slot(1); s <= applyBacklogBatchesMax+1; s++ {
		r.toApply(installItem(s), s)
	}
	go func() { done <- r.toApply(slotItem(applyBacklogBatchesMax+2, 1), applyBacklogBatchesMax+2) }()
	select {
	case <-done:
		t.Fatal("a batch past the item bound was taken without waiting")
	case <-time.After(50 * time.Millisecond):
	}
	close(r.stop)
	if ok := <-done; ok {
		t.Fatal("toApply waiting on a full backlog did not see the stop")
	}
	fmt.Printf("apply backlog: order kept through queue and backlog (planted overtaking: %v, caught); batches merge up to %d entries; hold at %d items or %d bytes; waits past %d items or %d bytes\n",
		planted, applyBacklogMergeEntriesMax, applyBacklogHoldBatches, applyBacklogHoldBytes, applyBacklogBatchesMax, applyBacklogBytesMax)
}

// backlogOrder feeds slots 1..6 through an apply queue of two with room
// made between them, as the apply loop makes it, and returns the order
// the queue received them in.
func backlogOrder(t *testing.T) []paxos.Slot {
	r := backlogReplica(2)
	q := &queueTaker{r: r}
	// Two fit the queue; the next ones wait in the backlog, merged,
	// without blocking.
	for s := paxos.Slot(1); s <= 5; s++ {
		if !r.toApply(slotItem(s, 10), s) {
			t.Fatal("toApply stopped")
		}
	}
	if n := r.applyBacklog.waiting.Load(); !testingBacklogOvertaken && (n != 1 || r.applyBacklog.bytes != int64(3*(10+slotItemOverheadBytes))) {
		t.Fatalf("backlog holds %d items, %d bytes; want 1, %d", n, r.applyBacklog.bytes, 3*(10+slotItemOverheadBytes))
	}
	// Room in the queue must not let a later batch overtake the backlog.
	q.take()
	if !r.toApply(slotItem(6, 10), 6) {
		t.Fatal("toApply stopped")
	}
	for len(r.applyC) > 0 || r.applyBacklog.waiting.Load() > 0 {
		q.take()
		r.drainApplyBacklog()
	}
	if r.applyBacklog.bytes != 0 || r.applyBacklog.items != nil {
		t.Fatalf("drained backlog holds %d bytes, %d items", r.applyBacklog.bytes, len(r.applyBacklog.items))
	}
	return q.got
}

// inOrder says whether slots are 1..n.
func inOrder(slots []paxos.Slot, n int) bool {
	for i, s := range slots {
		if s != paxos.Slot(i+1) {
			return false
		}
	}
	return len(slots) == n
}

// slowApplyDelay is the injected stall of the leader's apply loop in
// TestSlowApplyKeepsLeader: 25 election timeouts of the test cluster
// (100 ticks of 1 ms), and well below stuckAfter, so the stuck watch
// does not hand over.
const slowApplyDelay = 2500 * time.Millisecond

// TestSlowApplyKeepsLeader: the leader's apply loop stalls once for 25
// election timeouts while 64 writers keep many writes in flight (each
// gives up after 20 ms and writes the next, so commits go on without
// waiting for answers). The consensus loop parks the committed batches
// the apply queue has no room for in the backlog and goes on sending
// heartbeats: no node sees another ballot, and every write acknowledged
// is read back. Planted (TestingApplyQueueBlocks: the loop waits for the
// apply queue, as before the backlog), the same run loses its leader.
func TestSlowApplyKeepsLeader(t *testing.T) {
	res := slowApplyRun(t, false)
	t.Logf("backlog: %+v", res)
	if res.ballots != 0 {
		t.Errorf("the leader's ballot changed %d times while its apply stalled %v", res.ballots, slowApplyDelay)
	}
	if res.backlogMax == 0 {
		t.Errorf("no batch waited in the backlog: the stall did not fill the apply queue (%d acked), the run proves nothing", res.acked)
	}
	if res.lost != 0 {
		t.Errorf("%d acknowledged writes not read back", res.lost)
	}
	if res.acked == 0 {
		t.Fatal("no write was acknowledged")
	}
	TestingApplyQueueBlocks = true
	t.Cleanup(func() { TestingApplyQueueBlocks = false })
	planted := slowApplyRun(t, true)
	TestingApplyQueueBlocks = false
	caught := planted.ballots > 0
	fmt.Printf("slow apply: delay_ms=%d leader_changes=%d backlog_max_items=%d backlog_max_kib=%d holds=%d acked=%d lost=%d; planted (the loop waits for the apply queue): leader_changes=%d caught=%v\n",
		slowApplyDelay.Milliseconds(), res.ballots, res.backlogMax, res.backlogBytes>>10, res.holds, res.acked, res.lost, planted.ballots, caught)
	if !caught {
		t.Errorf("planted: the loop waited for the apply queue and the leader kept its ballot: the test cannot see heartbeats held behind the apply loop")
	}
}

type slowApplyResult struct {
	ballots      int   // ballots seen beyond the first
	backlogMax   int64 // the most items the leader's backlog held
	backlogBytes int64 // the most bytes it held
	holds        uint64
	acked        int
	lost         int
}

// slowApplyRun runs TestSlowApplyKeepsLeader's scenario once; planted
// runs skip the read-back (their leader changed).
func slowApplyRun(t *testing.T, planted bool) slowApplyResult {
	c := newTestCluster(t, 3, 0)
	ld := c.leader()
	c.put("warm", "up")
	first := c.nodes[ld].r.Status().Promised

	var (
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		mu      sync.Mutex
		acked   []string
		clients atomic.Uint64
	)
	clients.Store(1 << 20)
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("slow%d-%d", w, i)
				// A client per write: a write given up on is never retried.
				req := &proto.Request{Op: proto.OpPut, Tenant: testTenant, ClientID: clients.Add(1), Seq: 1, FirstUnacked: 1,
					Key: []byte(k), Value: []byte(k)}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				resp := c.nodes[ld].be.Do(ctx, testTenant, req)
				cancel()
				if resp.Status == proto.StatusOK {
					mu.Lock()
					acked = append(acked, k)
					mu.Unlock()
				}
			}
		}(w)
	}
	time.Sleep(200 * time.Millisecond)
	c.nodes[ld].r.faults.DelayNextApply(slowApplyDelay)
	seen := map[paxos.Ballot]bool{first: true}
	for end := time.Now().Add(slowApplyDelay + time.Second); time.Now().Before(end); {
		for _, nd := range c.nodes {
			if p := nd.r.Status().Promised; p != (paxos.Ballot{}) {
				seen[p] = true
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	res := slowApplyResult{ballots: len(seen) - 1, backlogMax: c.nodes[ld].r.applyBacklog.maxWaiting.Load(),
		backlogBytes: c.nodes[ld].r.applyBacklog.maxBytes.Load(),
		holds:        uint64(counterValue(c.nodes[ld].r.metrics.ApplyBacklogHolds)), acked: len(acked)}
	if planted {
		return res
	}
	for _, k := range acked {
		if got := c.get(k); got != k {
			res.lost++
			if res.lost <= 5 {
				t.Errorf("acknowledged write %s reads %q", k, got)
			}
		}
	}
	return res
}
