package replica

import (
	"fmt"
	"testing"

	"synod/paxos"
)

// TestAccelMirrorAgrees runs a mixed cluster (accel on nodes 1 and 2, off
// on 3) through writes and a leader change: the planes' commit decisions
// agree with software's on every node that runs one.
func TestAccelMirrorAgrees(t *testing.T) {
	c := newTestClusterWith(t, func(tc *testCluster) {
		tc.accelOn = map[paxos.NodeID]bool{1: true, 2: true}
		tc.drr = true // and the tenant scheduler in front of the proposer
	})
	for i := 0; i < 100; i++ {
		c.put(fmt.Sprintf("a%d", i), "v")
	}
	old := c.leader()
	c.stop(old)
	for i := 0; i < 100; i++ {
		c.put(fmt.Sprintf("b%d", i), "v")
	}
	commits, mismatches := 0, 0
	var handups uint64
	for id, n := range c.nodes {
		res, on := n.r.AccelResult()
		if on != (id == 1 || id == 2) {
			t.Fatalf("node %d: accel on=%v", id, on)
		}
		commits += res.Commits
		mismatches += res.Mismatches
		handups += res.HandUps
		if res.Mismatches != 0 {
			t.Errorf("node %d: %v", id, res)
		}
	}
	if commits == 0 {
		t.Fatal("no commit was checked")
	}
	t.Logf("accel: commits=%d mismatches=%d handups=%d", commits, mismatches, handups)
}
