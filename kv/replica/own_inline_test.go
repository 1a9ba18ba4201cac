package replica

import (
	"fmt"
	"os"
	"testing"

	"synod/pmem"
)

// TestOwnWritesPersistedInlineOnShm holds ownPersistInline's contract: on
// shm acceptor logs the leader persists its own writes on the consensus
// loop and hands the persister none, and every write still commits on
// every replica (the vote counted after the persist, as before). Planted
// (testingOwnPersistAsync: the persister for every mode), runs are handed
// over.
func TestOwnWritesPersistedInlineOnShm(t *testing.T) {
	for _, planted := range []bool{false, true} {
		testingOwnPersistAsync = planted
		c := newTestCluster(t, 3, 0)
		testingOwnPersistAsync = false
		if c.pmemMode() != pmem.ModeShm {
			if os.Getenv("CI") == "true" {
				t.Fatal("no /dev/shm: the acceptor logs are not in shm mode")
			}
			t.Skip("no /dev/shm: the acceptor logs are not in shm mode")
		}
		l := c.leader()
		before := c.nodes[l].r.own.handed.Load()
		const writes = 40
		for i := 0; i < writes; i++ {
			c.put(fmt.Sprintf("k%d", i), "v")
		}
		handed := c.nodes[l].r.own.handed.Load() - before
		applied := c.nodes[l].r.Applied()
		for id := range c.nodes {
			c.waitApplied(id, applied)
		}
		c.stopAll()
		t.Logf("own persist: planted=%v writes=%d runs_handed_to_persister=%d", planted, writes, handed)
		switch {
		case !planted && handed != 0:
			t.Fatalf("%d runs of own writes handed to the persister on shm logs, want 0", handed)
		case planted && handed == 0:
			t.Fatal("planted: no run handed to the persister; the test does not see the path")
		}
	}
}
