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

// TestApplyBacklogOrderAndBounds holds the backlog to its contract
// (apply_backlog.go): the consensus loop never waits while the backlog
// has room, items reach the apply queue in order whichever path they take,
// a leader holds new writes past half of either bound, and a full backlog
// (batches or bytes) waits for the apply queue, in order.
func TestApplyBacklogOrderAndBounds(t *testing.T) {
	if got := backlogOrder(t); !inOrder(got) {
		t.Fatalf("the apply queue received slots %v, want 1..6 in order", got)
	}
	testingBacklogOvertaken = true
	planted := backlogOrder(t)
	testingBacklogOvertaken = false
	if inOrder(planted) {
		t.Fatalf("planted (a batch overtakes the backlog): the apply queue still received %v in order; the check cannot see it", planted)
	}

	var got []paxos.Slot
	r := backlogReplica(1)
	take := func() {
		it := <-r.applyC
		got = append(got, it.entries[0].Slot)
	}
	// The hold line, by batches and by bytes; crossing back releases it.
	r.toApply(slotItem(1, 1), 1) // the queue
	for s := paxos.Slot(2); s <= applyBacklogHoldBatches; s++ {
		r.toApply(slotItem(s, 1), s)
	}
	if r.applyBacklogHolds() {
		t.Fatalf("leader holds writes with %d batches waiting, below the line %d", r.applyBacklog.waiting.Load(), applyBacklogHoldBatches)
	}
	r.toApply(slotItem(applyBacklogHoldBatches+1, 1), applyBacklogHoldBatches+1)
	if !r.applyBacklogHolds() || r.applyBacklog.holds.Load() != 1 {
		t.Fatalf("leader takes writes with %d batches waiting (line %d)", r.applyBacklog.waiting.Load(), applyBacklogHoldBatches)
	}
	<-r.applyC
	r.drainApplyBacklog()
	if r.applyBacklogHolds() {
		t.Fatal("leader still holds writes below the line")
	}
	r.status.Store(&paxos.Status{Role: paxos.RoleFollower})
	for s := paxos.Slot(applyBacklogHoldBatches + 2); s < applyBacklogBatchesMax; s++ {
		r.toApply(slotItem(s, 1), s)
	}
	if r.holdProposals() {
		t.Fatal("a follower holds writes: it has none to hold, and must take them to refuse them")
	}

	r = backlogReplica(1)
	r.toApply(slotItem(1, 1), 1)
	r.toApply(slotItem(2, applyBacklogHoldBytes-1), 2)
	if r.applyBacklogHolds() {
		t.Fatal("leader holds writes below the byte line")
	}
	r.toApply(slotItem(3, 1), 3)
	if !r.applyBacklogHolds() {
		t.Fatalf("leader takes writes with %d bytes waiting (line %d)", r.applyBacklog.bytes, applyBacklogHoldBytes)
	}

	// Full by bytes: the next item waits for the apply queue, and the
	// backlog goes first.
	r.toApply(slotItem(4, applyBacklogBytesMax-int(r.applyBacklog.bytes)), 4) // exactly full
	done := make(chan bool)
	go func() { done <- r.toApply(slotItem(5, 1), 5) }()
	select {
	case <-done:
		t.Fatal("an item past the byte bound was taken without waiting")
	case <-time.After(50 * time.Millisecond):
	}
	got = got[:0]
	for len(got) < 5 {
		take()
	}
	if ok := <-done; !ok {
		t.Fatal("toApply stopped")
	}
	for i, s := range got {
		if s != paxos.Slot(i+1) {
			t.Fatalf("past the byte bound the apply queue received %v, want 1..5", got)
		}
	}

	// Full by batches: the same, and a stop ends the wait.
	r = backlogReplica(1)
	for s := paxos.Slot(1); s <= applyBacklogBatchesMax+1; s++ {
		r.toApply(slotItem(s, 1), s)
	}
	go func() { done <- r.toApply(slotItem(applyBacklogBatchesMax+2, 1), applyBacklogBatchesMax+2) }()
	select {
	case <-done:
		t.Fatal("an item past the batch bound was taken without waiting")
	case <-time.After(50 * time.Millisecond):
	}
	close(r.stop)
	if ok := <-done; ok {
		t.Fatal("toApply waiting on a full backlog did not see the stop")
	}
	fmt.Printf("apply backlog: order kept through queue and backlog (planted overtaking: %v, caught); hold at %d batches or %d bytes; waits past %d batches or %d bytes\n",
		planted, applyBacklogHoldBatches, applyBacklogHoldBytes, applyBacklogBatchesMax, applyBacklogBytesMax)
}

// backlogOrder feeds slots 1..6 through an apply queue of two with room
// made between them, as the apply loop makes it, and returns the order
// the queue received them in.
func backlogOrder(t *testing.T) []paxos.Slot {
	r := backlogReplica(2)
	var got []paxos.Slot
	take := func() {
		it := <-r.applyC
		got = append(got, it.entries[0].Slot)
	}
	// Two fit the queue; the next ones wait in the backlog without
	// blocking.
	for s := paxos.Slot(1); s <= 5; s++ {
		if !r.toApply(slotItem(s, 10), s) {
			t.Fatal("toApply stopped")
		}
	}
	if n := r.applyBacklog.waiting.Load(); !testingBacklogOvertaken && (n != 3 || r.applyBacklog.bytes != 30) {
		t.Fatalf("backlog holds %d items, %d bytes; want 3, 30", n, r.applyBacklog.bytes)
	}
	// Room in the queue must not let a later item overtake the backlog.
	take()
	if !r.toApply(slotItem(6, 10), 6) {
		t.Fatal("toApply stopped")
	}
	for len(r.applyC) > 0 || r.applyBacklog.waiting.Load() > 0 {
		take()
		r.drainApplyBacklog()
	}
	if r.applyBacklog.bytes != 0 || r.applyBacklog.items != nil {
		t.Fatalf("drained backlog holds %d bytes, %d items", r.applyBacklog.bytes, len(r.applyBacklog.items))
	}
	return got
}

func inOrder(slots []paxos.Slot) bool {
	for i, s := range slots {
		if s != paxos.Slot(i+1) {
			return false
		}
	}
	return len(slots) == 6
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
// is read back. Planted (testingApplyQueueBlocks: the loop waits for the
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
	testingApplyQueueBlocks = true
	t.Cleanup(func() { testingApplyQueueBlocks = false })
	planted := slowApplyRun(t, true)
	testingApplyQueueBlocks = false
	caught := planted.ballots > 0
	fmt.Printf("slow apply: delay_ms=%d leader_changes=%d backlog_max_batches=%d holds=%d acked=%d lost=%d; planted (the loop waits for the apply queue): leader_changes=%d caught=%v\n",
		slowApplyDelay.Milliseconds(), res.ballots, res.backlogMax, res.holds, res.acked, res.lost, planted.ballots, caught)
	if !caught {
		t.Errorf("planted: the loop waited for the apply queue and the leader kept its ballot: the test cannot see heartbeats held behind the apply loop")
	}
}

type slowApplyResult struct {
	ballots    int   // ballots seen beyond the first
	backlogMax int64 // the most batches the leader's backlog held
	holds      uint64
	acked      int
	lost       int
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
		holds: c.nodes[ld].r.applyBacklog.holds.Load(), acked: len(acked)}
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
