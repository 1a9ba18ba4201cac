package replica

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/paxos"
)

// admissionFullLog reports itself at capacity while full is set, so the
// consensus loop's admission refuses every Accept (the node still
// answers heartbeats).
type admissionFullLog struct {
	AcceptorLog
	full *atomic.Bool
}

func (l admissionFullLog) Usage() (used, capacity int64) {
	used, capacity = l.AcceptorLog.Usage()
	if l.full.Load() {
		return capacity, capacity
	}
	return used, capacity
}

// TestLeaderSaysItCommitsNothing: a leader whose followers take none of
// its Accepts (their logs at the admission line) keeps its followers and
// its lease, and commits nothing; CommitWait (/status commit_wait_ms) says
// how long, and drops to 0 once the followers take the write and it
// commits (commit_wait.go).
func TestLeaderSaysItCommitsNothing(t *testing.T) {
	var full [4]atomic.Bool
	c := newTestClusterWith(t, func(c *testCluster) {
		c.wrapLog = func(id paxos.NodeID, l AcceptorLog) AcceptorLog {
			return admissionFullLog{AcceptorLog: l, full: &full[id]}
		}
	})
	c.put("before", "1")
	l := c.leader()
	r := c.nodes[l].r
	for id := paxos.NodeID(1); id <= 3; id++ {
		full[id].Store(id != l)
	}
	done := make(chan proto.Status, 1)
	go func() { done <- c.do(l, putReq("waits", "1"), 30*time.Second).Status }()
	want := time.Duration(3*c.election()) * time.Millisecond
	start := time.Now()
	for r.CommitWait() < want {
		if time.Since(start) > 10*want {
			t.Fatalf("commit wait %v after %v (role %v, commit %d, last slot %d): want >= %v", r.CommitWait(), time.Since(start), r.Status().Role, r.Status().Commit, r.Status().LastSlot, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := r.Status(); st.Role != paxos.RoleLeader {
		t.Fatalf("node %d stopped leading while its followers refused its accepts: %v", l, st.Role)
	}
	waited := r.CommitWait()
	for id := range full {
		full[id].Store(false)
	}
	if s := <-done; s != proto.StatusOK {
		t.Fatalf("the waiting put: %v, want OK once the followers take it", s)
	}
	for start = time.Now(); r.CommitWait() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*want {
			t.Fatalf("commit wait still %v after the put committed", r.CommitWait())
		}
	}
	fmt.Printf("commit wait: leader=%d waited_at_least=%v (followers refusing accepts), 0 after the commit\n", l, waited.Round(time.Millisecond))
}
