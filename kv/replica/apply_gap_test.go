package replica

import (
	"errors"
	"testing"
	"time"

	"synod/kv/sm"
	"synod/paxos"
)

// TestApplyGapStopsTheReplica: committed entries reaching the apply loop
// with a slot missing (as the shutdown Ready once handed over 1910, 1911,
// 1914) must stop the replica with an error naming the gap, not apply past
// it: the state machine refuses the slot (sm.ErrSlotGap) and the replica
// reports it as fatal, its state machine unchanged.
func TestApplyGapStopsTheReplica(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	c.put("k", "v")
	lead := c.leader()
	var f paxos.NodeID
	for id := range c.nodes {
		if id != lead {
			f = id
			break
		}
	}
	r := c.nodes[f].r
	c.waitApplied(f, c.nodes[lead].r.Applied())
	applied := r.sm.Applied()
	gap := paxos.Slot(applied + 2)
	r.applyC <- applyItem{entries: []paxos.Entry{{Slot: gap, Type: paxos.EntryNoop}}}
	select {
	case err := <-r.Fatal():
		if !errors.Is(err, sm.ErrSlotGap) {
			t.Fatalf("fatal error %v, want one wrapping sm.ErrSlotGap", err)
		}
		if got := r.sm.Applied(); got != applied {
			t.Fatalf("state machine applied %d after the refused slot %d, want %d", got, gap, applied)
		}
		t.Logf("slot %d after applied %d: %v", gap, applied, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("slot %d handed to the apply loop after applied %d: no fatal error in 10 s (applied now %d)", gap, applied, r.sm.Applied())
	}
}
