package replica

import (
	"testing"

	"synod/paxos"
)

// TestOwnWritesQueue: consecutive runs of one ballot merge into one; the
// queue holds at most ownRangesMax runs and refuses the next without
// changing; a synchronous persist covers everything queued plus its own
// run; the persister's batch comes back through done; every hand-over
// wakes the other side.
func TestOwnWritesQueue(t *testing.T) {
	var o ownWrites
	o.init()
	b := paxos.Ballot{Round: 1, Node: 1}
	if !o.queue(ownRange{b: b, first: 1, last: 3}) || !o.queue(ownRange{b: b, first: 4, last: 4}) {
		t.Fatal("queue refused with room")
	}
	if len(o.kick) != 1 {
		t.Fatal("queueing did not wake the persister")
	}
	if got := o.take(); len(got) != 1 || got[0] != (ownRange{b: b, first: 1, last: 4}) {
		t.Fatalf("take: %v, want one run 1..4", got)
	}
	// Disjoint runs (a new leadership each) up to the bound.
	for i := 0; i < ownRangesMax; i++ {
		s := paxos.Slot(10 + 2*i)
		if !o.queue(ownRange{b: paxos.Ballot{Round: uint64(2 + i), Node: 1}, first: s, last: s}) {
			t.Fatalf("run %d refused below ownRangesMax", i)
		}
	}
	if o.queue(ownRange{b: paxos.Ballot{Round: 999, Node: 1}, first: 500, last: 500}) {
		t.Fatal("a run past ownRangesMax was queued")
	}
	if !o.pending() {
		t.Fatal("nothing pending")
	}
	rg := ownRange{b: paxos.Ballot{Round: 999, Node: 1}, first: 500, last: 500}
	covered := o.coveredBySync(rg)
	if len(covered) != ownRangesMax+1 || covered[len(covered)-1] != rg || o.pending() {
		t.Fatalf("coveredBySync: %d runs, last %v, pending %v", len(covered), covered[len(covered)-1], o.pending())
	}
	if len(o.doneC) != 1 {
		t.Fatal("a synchronous persist did not wake the consensus loop")
	}
	<-o.doneC
	if done := o.takeDone(); len(done) != ownRangesMax+1 {
		t.Fatalf("takeDone: %d runs", len(done))
	}
	o.finish([]ownRange{{b: b, first: 5, last: 6}})
	if len(o.doneC) != 1 {
		t.Fatal("finish did not wake the consensus loop")
	}
	if done := o.takeDone(); len(done) != 1 || done[0].last != 6 {
		t.Fatalf("takeDone after finish: %v", done)
	}
}
