package replica

import (
	"fmt"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/paxos"
)

// TestStepDownTarget: a stuck leader hands over only to a voter other than
// itself whose report is fresh and says it is neither stuck nor unable to
// read its disk; one with room before one below its reserve, then one
// other than the last target, then the highest reported commit, then the
// lowest id; and it counts the fresh reports it saw.
func TestStepDownTarget(t *testing.T) {
	now := time.Unix(1000, 0)
	fresh, stale := now.Add(-diskReportStaleAfter+time.Millisecond), now.Add(-diskReportStaleAfter)
	type rep struct {
		d  DiskSpace
		at time.Time
	}
	for _, tc := range []struct {
		name   string
		voters []paxos.NodeID
		reps   []rep
		want   paxos.NodeID
		seen   int
		avoid  paxos.NodeID
		commit map[paxos.NodeID]paxos.Slot
	}{
		{"no reports", []paxos.NodeID{1, 2, 3}, nil, 0, 0, 0, nil},
		{"healthy lowest id", []paxos.NodeID{1, 3, 2}, []rep{{DiskSpace{Node: 3}, fresh}, {DiskSpace{Node: 2}, fresh}}, 2, 2, 0, nil},
		{"stale at exactly the limit", []paxos.NodeID{1, 2, 3}, []rep{{DiskSpace{Node: 2}, stale}, {DiskSpace{Node: 3}, fresh}}, 3, 1, 0, nil},
		{"stuck is never a target", []paxos.NodeID{1, 2, 3}, []rep{{DiskSpace{Node: 2, Stuck: true}, fresh}, {DiskSpace{Node: 3, Stuck: true, Low: true}, fresh}}, 0, 2, 0, nil},
		{"unreadable disk is never a target", []paxos.NodeID{1, 2}, []rep{{DiskSpace{Node: 2, Low: true, ReadFailed: true}, fresh}}, 0, 1, 0, nil},
		{"room before low", []paxos.NodeID{1, 2, 3}, []rep{{DiskSpace{Node: 2, Low: true}, fresh}, {DiskSpace{Node: 3}, fresh}}, 3, 2, 0, nil},
		{"low when nothing better", []paxos.NodeID{1, 2, 3}, []rep{{DiskSpace{Node: 2, Low: true}, fresh}, {DiskSpace{Node: 3, Stuck: true}, fresh}}, 2, 2, 0, nil},
		{"self never", []paxos.NodeID{1, 2}, []rep{{DiskSpace{Node: 1}, fresh}}, 0, 0, 0, nil},
		{"learners are not voters", []paxos.NodeID{1, 2}, []rep{{DiskSpace{Node: 4}, fresh}}, 0, 0, 0, nil},
		{"not the target that did not take over", []paxos.NodeID{1, 2, 3}, []rep{{DiskSpace{Node: 2}, fresh}, {DiskSpace{Node: 3}, fresh}}, 3, 2, 2, nil},
		{"that target when it is the only one", []paxos.NodeID{1, 2, 3}, []rep{{DiskSpace{Node: 2}, fresh}, {DiskSpace{Node: 3, Stuck: true}, fresh}}, 2, 2, 2, nil},
		{"room still before the avoided one", []paxos.NodeID{1, 2, 3}, []rep{{DiskSpace{Node: 2}, fresh}, {DiskSpace{Node: 3, Low: true}, fresh}}, 2, 2, 2, nil},
		{"the highest commit before the lowest id", []paxos.NodeID{1, 2, 3}, []rep{{DiskSpace{Node: 2}, fresh}, {DiskSpace{Node: 3}, fresh}}, 3, 2, 0, map[paxos.NodeID]paxos.Slot{2: 2167, 3: 2234}},
		{"an unreported commit counts as 0", []paxos.NodeID{1, 2, 3}, []rep{{DiskSpace{Node: 2}, fresh}, {DiskSpace{Node: 3}, fresh}}, 3, 2, 0, map[paxos.NodeID]paxos.Slot{3: 1}},
		{"equal commits: the lowest id", []paxos.NodeID{1, 3, 2}, []rep{{DiskSpace{Node: 2}, fresh}, {DiskSpace{Node: 3}, fresh}}, 2, 2, 0, map[paxos.NodeID]paxos.Slot{2: 7, 3: 7}},
		{"room before commit", []paxos.NodeID{1, 2, 3}, []rep{{DiskSpace{Node: 2}, fresh}, {DiskSpace{Node: 3, Low: true}, fresh}}, 2, 2, 0, map[paxos.NodeID]paxos.Slot{2: 5, 3: 9}},
		{"not the last target, whatever its commit", []paxos.NodeID{1, 2, 3}, []rep{{DiskSpace{Node: 2}, fresh}, {DiskSpace{Node: 3}, fresh}}, 2, 2, 3, map[paxos.NodeID]paxos.Slot{2: 5, 3: 9}},
	} {
		var dr diskReports
		dr.latest = map[paxos.NodeID]diskReportSeen{}
		for _, r := range tc.reps {
			dr.latest[r.d.Node] = diskReportSeen{d: r.d, at: r.at}
		}
		to, seen := dr.stepDownTarget(now, tc.voters, 1, tc.avoid, tc.commit)
		if to != tc.want || seen != tc.seen {
			t.Errorf("%s: target %d (%d fresh), want %d (%d fresh)", tc.name, to, seen, tc.want, tc.seen)
		}
	}
}

// TestStuckLeaderHandsOver: a leader whose apply loop stalls (as Pebble
// does on a full disk) keeps its followers, so no election replaces it;
// the progress watch must. Three replicas sharing healthy disk reports:
// the leader's apply is stalled for 20 s; within stuckAfter and a little
// it hands leadership to a healthy voter, which serves writes and
// linearizable reads. Then the new leader's apply stalls too: it hands
// over to the third node, never back to the first, whose reports still
// say it is stuck. When the stalls end, every node applies everything.
func TestStuckLeaderHandsOver(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	for _, nd := range c.nodes {
		nd.r.ShareDiskSpace(func() DiskSpace { return DiskSpace{FreeBytes: 1 << 30} })
	}
	first := c.servingLeader("before", "0")

	// stallAndWait stalls from's apply, makes it commit something (its
	// apply loop takes the stall with it), and waits for another node to
	// lead; it returns that node and how long the hand-over took.
	stallAndWait := func(from paxos.NodeID, stall time.Duration, key string) (paxos.NodeID, time.Duration) {
		t.Helper()
		began := time.Now()
		fromBallot := c.nodes[from].r.Status().Ballot
		c.nodes[from].r.faults.DelayNextApply(stall)
		resp := c.do(from, putReq(key, "stuck"), time.Second)
		if resp.Status == proto.StatusOK {
			t.Fatalf("a put through node %d was answered with its apply stalled", from)
		}
		for {
			// A newer leader, not one deposed before from was elected.
			if id, _ := c.leading(fromBallot, from); id != 0 {
				return id, time.Since(began)
			}
			if time.Since(began) > stuckAfter+8*time.Second {
				st := c.nodes[from].r
				t.Fatalf("node %d's apply stalled %v ago and it still leads (stuck %v, status %+v)",
					from, time.Since(began).Round(time.Millisecond), st.Stuck(), st.Status())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	second, took := stallAndWait(first, 20*time.Second, "stuck-1")
	if took < stuckAfter {
		t.Fatalf("leadership moved after %v, before the node was stuck for %v", took, stuckAfter)
	}
	if !c.nodes[first].r.Stuck() || gaugeValue(c.nodes[first].r.metrics.Stuck.Stuck) != 1 {
		t.Fatalf("node %d handed over but does not say it is stuck", first)
	}
	if n := counterValue(c.nodes[first].r.metrics.Stuck.Transfers.WithLabelValues("started")); n != 1 {
		t.Fatalf("node %d counted %v hand-overs, want 1", first, n)
	}
	c.putVia(second, "after", "1")
	if resp := c.do(second, getReq("after", false), 2*time.Second); resp.Status != proto.StatusOK || string(resp.Value) != "1" {
		t.Fatalf("linearizable get on the new leader %d: %v %q", second, resp.Status, resp.Value)
	}

	third, took2 := stallAndWait(second, 8*time.Second, "stuck-2")
	if third == first {
		t.Fatalf("node %d handed leadership back to node %d, which still reports itself stuck", second, first)
	}
	c.putVia(third, "last", "2")
	t.Logf("stuck leaders: %d -> %d after %v, %d -> %d after %v", first, second, took.Round(time.Millisecond),
		second, third, took2.Round(time.Millisecond))

	// The stalls end: every node applies everything, and says so.
	lead := c.leader()
	for id := range c.nodes {
		c.waitApplied(id, c.nodes[lead].r.Applied())
		waitFor(t, fmt.Sprintf("node %d no longer stuck", id), func() bool { return !c.nodes[id].r.Stuck() })
	}
	for _, kv := range [][2]string{{"before", "0"}, {"after", "1"}, {"last", "2"}} {
		if got := c.get(kv[0]); got != kv[1] {
			t.Fatalf("%s = %q after the stalls, want %q", kv[0], got, kv[1])
		}
	}
}

// TestHungPersistHandsOver: a leader whose acceptor-log persist hangs (a
// disk that stops answering msync) commits its slot with its followers'
// votes but cannot deliver it (a leader applies a slot only once its own
// copy is durable), so it applies nothing: the watch counts it stuck and
// it hands over, and the new leader serves writes while the old one's
// persist still hangs.
func TestHungPersistHandsOver(t *testing.T) {
	const hang = 9 * time.Second
	c := newTestCluster(t, 3, 0)
	for _, nd := range c.nodes {
		nd.r.ShareDiskSpace(func() DiskSpace { return DiskSpace{FreeBytes: 1 << 30} })
	}
	old := c.servingLeader("before", "0")
	c.nodes[old].r.faults.DelayNextPersist(hang)
	began := time.Now()
	go c.do(old, putReq("hung", "v"), hang+time.Second)
	next := c.leader(old)
	took := time.Since(began)
	c.putVia(next, "served", "1")
	served := time.Since(began)
	t.Logf("hung persist: node %d handed over to %d after %v; a write was served after %v", old, next, took.Round(time.Millisecond), served.Round(time.Millisecond))
	if took < stuckAfter || served >= hang {
		t.Fatalf("hand-over after %v (stuck after %v), a write served after %v: want both inside the %v hang", took, stuckAfter, served, hang)
	}
}

// TestHungFollowerSaysStuck: the case an outside tester found. A follower
// whose apply loop stalls can block its own consensus loop too (a full
// apply backlog), which then never looked: the follower went on reporting
// itself healthy, and a stuck leader handed over to it again and again
// (three hand-overs that never completed, every write held 29 s). Here
// the follower's apply is stalled and its consensus loop blocked: it must
// say it is stuck within stuckAfter and a little (the watchdog looks off
// the consensus loop), and when the leader's apply stalls too, leadership
// goes to the third node.
func TestHungFollowerSaysStuck(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	for _, nd := range c.nodes {
		nd.r.ShareDiskSpace(func() DiskSpace { return DiskSpace{FreeBytes: 1 << 30} })
	}
	lead := c.servingLeader("first", "0")
	var hung, third paxos.NodeID
	for id := range c.nodes {
		switch {
		case id == lead:
		case hung == 0:
			hung = id
		default:
			third = id
		}
	}
	c.nodes[hung].r.faults.DelayNextApply(20 * time.Second)
	c.put("a", "1")
	c.put("b", "2") // the hung follower learns the first one committed
	waitFor(t, "the hung follower to see a commit it cannot apply", func() bool {
		r := c.nodes[hung].r
		return r.Status().Commit > r.Applied()
	})
	release := c.stall(hung) // its consensus loop blocked, as behind a full apply backlog
	defer release()
	began := time.Now()
	for !c.nodes[hung].r.Stuck() {
		if time.Since(began) > stuckAfter+3*time.Second {
			t.Fatalf("node %d applied nothing for %v with its consensus loop blocked, and does not say it is stuck", hung, time.Since(began).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
	saidAfter := time.Since(began)

	c.nodes[lead].r.faults.DelayNextApply(10 * time.Second)
	c.do(lead, putReq("c", "3"), time.Second)
	next := c.leader(lead)
	if next != third {
		t.Fatalf("the stuck leader %d handed over to %d, want the healthy node %d (node %d is hung)", lead, next, third, hung)
	}
	t.Logf("hung follower %d said stuck after %v; stuck leader %d handed over to %d", hung, saidAfter.Round(time.Millisecond), lead, next)
}
