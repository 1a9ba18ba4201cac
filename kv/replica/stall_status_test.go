package replica

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/paxos"
)

// switchedFullLog is an acceptor log a test can make refuse every append
// as full, whatever its usage.
type switchedFullLog struct {
	AcceptorLog
	full *atomic.Bool
}

func (l switchedFullLog) Append(entries []paxos.Entry) error {
	if l.full.Load() {
		return fmt.Errorf("%w: switched full by the test", ErrLogFull)
	}
	return l.AcceptorLog.Append(entries)
}

// TestStalledLeaderSaysItStepsDown: a leader whose Ready stalls on a full
// acceptor log takes no inbound message, so it hears from no majority and
// paxos's check quorum makes it a follower on the ticks it still gets.
// Its published status (what clients are answered from, and /status)
// must say so while the stall lasts: once it did not, and a node stalled
// as leader answered its clients as leader for 35 minutes of an e2e run
// while the other two had elected another. Planted
// (testingStallHidesStatus): the status stays "leader".
//
// A leader's own acceptances no longer stall a Ready (own_backlog.go), only
// a follower's answered ones do; the test plants the old own-entry stall
// to make a leader stall.
func TestStalledLeaderSaysItStepsDown(t *testing.T) {
	testingNoOwnBacklog = true
	defer func() { testingNoOwnBacklog = false }()
	stepped, line := stalledLeaderStatus(t)
	if !stepped {
		t.Fatalf("the stalled leader still says it leads: %s", line)
	}
	testingStallHidesStatus = true
	defer func() { testingStallHidesStatus = false }()
	pStepped, pLine := stalledLeaderStatus(t)
	if pStepped {
		t.Fatalf("planted (status hidden while stalled): the stalled leader said it stepped down (%s): the test does not show it", pLine)
	}
	fmt.Printf("stalled leader: %s; planted (status hidden while stalled): %s\n", line, pLine)
}

// newSwitchedFullCluster starts a test cluster whose node id's acceptor
// log refuses every append as full while full[id] is set.
func newSwitchedFullCluster(t *testing.T) (*testCluster, *[4]atomic.Bool) {
	full := new([4]atomic.Bool)
	c := newTestClusterWith(t, func(c *testCluster) {
		c.wrapLog = func(id paxos.NodeID, l AcceptorLog) AcceptorLog {
			return switchedFullLog{AcceptorLog: l, full: &full[id]}
		}
	})
	return c, full
}

func stalledLeaderStatus(t *testing.T) (stepped bool, line string) {
	c, full := newSwitchedFullCluster(t)
	defer c.stopAll() // the caller changes a testing knob next
	c.put("before", "1")
	l := c.leader()
	full[l].Store(true)
	// A write makes the leader's next Ready carry its own acceptance,
	// which does not fit.
	go c.do(l, putReq("stall", "1"), 5*time.Second)
	r := c.nodes[l].r
	start := time.Now()
	deadline := start.Add(time.Duration(20*c.election()) * time.Millisecond)
	for time.Now().Before(deadline) {
		if counterValue(r.metrics.LogStalls) > 0 && r.Status().Role != paxos.RoleLeader {
			// The others elect a leader; a write sent to the stalled node
			// is redirected, not held.
			other := c.leader(l)
			resp := c.do(l, putReq("after", "1"), 5*time.Second)
			if resp.Status != proto.StatusNotLeader {
				t.Fatalf("a write to the stalled node %d after it stepped down: %v, want NOT_LEADER", l, resp.Status)
			}
			full[l].Store(false)
			return true, fmt.Sprintf("stepped_down_after=%v new_leader=%d", time.Since(start).Round(time.Millisecond), other)
		}
		time.Sleep(10 * time.Millisecond)
	}
	full[l].Store(false)
	return false, fmt.Sprintf("stalls=%v role=%v after %v", counterValue(r.metrics.LogStalls), r.Status().Role, time.Since(start).Round(time.Millisecond))
}
