package replica

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/kv/sm"
	"synod/paxos"
	"synod/pmem"
)

// Tests of the clock contract (clock.go) and of the other findings of the
// pauses-and-restarts review, on in-process replicas. The end-to-end
// versions, with real processes under SIGSTOP and SIGKILL, are in e2e.

// stall blocks node id's consensus loop (the loop runs the control
// function and waits in it) until the returned release is called (once or
// more).
func (c *testCluster) stall(id paxos.NodeID) (release func()) {
	released := make(chan struct{})
	c.nodes[id].r.controlC <- func() { <-released }
	var once sync.Once
	return func() { once.Do(func() { close(released) }) }
}

// partition cuts id off from every other node, both ways.
func (c *testCluster) partition(id paxos.NodeID) {
	for other, n := range c.nodes {
		if other == id {
			continue
		}
		n.r.faults.Block(id)
		c.nodes[id].r.faults.Block(other)
	}
}

// TestStalledLeaderServesNoStaleRead: the leader's consensus loop stalls
// (as under SIGSTOP, a GC pause or CPU starvation) for longer than its
// lease while the majority elects a new leader and acknowledges a newer
// value. A linearizable read that reaches the old leader after that
// acknowledgement, while it is still stalled, must not be answered with
// the old value when the loop resumes: the node's lease check must see the
// ticks that passed (clock.go). On the old loop, which stepped queued
// inputs before the owed ticks whenever the select picked them first, about
// half of these trials returned the old value.
func TestStalledLeaderServesNoStaleRead(t *testing.T) {
	const trials = 8
	stale, refused := stalledLeaderTrials(t, trials, false)
	t.Logf("stalled leader: trials=%d stale_reads=%d refused=%d", trials, stale, refused)
	if stale > 0 {
		t.Fatalf("%d of %d resumed old leaders answered a linearizable read with the value from before their stall", stale, trials)
	}
}

// TestStalledLeaderPlantedStaleClockCaught plants the stale clock
// (TestingStaleClock: inputs stepped with the clock of the last ticker
// event) and checks that the trials above catch it.
func TestStalledLeaderPlantedStaleClockCaught(t *testing.T) {
	TestingStaleClock = true
	defer func() { TestingStaleClock = false }()
	if stale, _ := stalledLeaderTrials(t, 16, true); stale == 0 {
		t.Fatal("the planted stale clock served no stale read in 16 trials")
	}
}

// stalledLeaderTrials runs the trials of TestStalledLeaderServesNoStaleRead
// (stopping at the first stale read when untilStale) and counts the reads
// answered with the old value and those refused.
func stalledLeaderTrials(t *testing.T, trials int, untilStale bool) (stale, refused int) {
	c := newTestCluster(t, 3, 0)
	defer c.stopAll() // the caller changes a testing knob next
	for trial := 0; trial < trials && !(untilStale && stale > 0); trial++ {
		key := fmt.Sprintf("k%d", trial)
		c.put(key, "old")
		l := c.leader()
		waitFor(t, "the leader's lease", func() bool { return c.nodes[l].r.Status().LeaseValid })
		release := c.stall(l)
		c.partition(l)
		nl := c.leader(l)
		c.putVia(nl, key, "new") // acknowledged by the new leader
		// The read reaches the stalled old leader after that
		// acknowledgement: it must not return "old".
		done := make(chan *proto.Response, 1)
		go func() { done <- c.do(l, getReq(key, false), 5*time.Second) }()
		waitFor(t, "the read to queue at the stalled leader", func() bool { return len(c.nodes[l].r.readC) > 0 })
		release()
		resp := <-done
		switch {
		case resp.Status == proto.StatusOK && string(resp.Value) == "old":
			stale++
			t.Logf("trial %d: the resumed old leader %d answered a linearizable read with the value from before its stall", trial, l)
		case resp.Status == proto.StatusOK:
			t.Fatalf("trial %d: read %q from the partitioned old leader", trial, resp.Value)
		default:
			refused++
		}
		for _, n := range c.nodes {
			n.r.faults.HealAll()
		}
	}
	return stale, refused
}

// putVia writes through node id, retrying until it is acknowledged there.
func (c *testCluster) putVia(id paxos.NodeID, key, val string) {
	c.t.Helper()
	req := putReq(key, val)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp := c.do(id, req, 2*time.Second); resp.Status == proto.StatusOK {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.t.Fatalf("put %s via node %d never succeeded", key, id)
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestStalledFollowerLeaseRunsFromItsStep: a follower whose loop stalled
// steps the leader's queued heartbeats when it resumes. The lease its ack
// grants must run from the moment it steps them (its clock caught up
// first), so it refuses another ballot for LeaseTicks after that moment.
// With a stale clock the grant would end at (stall start + LeaseTicks),
// long past once the clock catches up, and the follower would promise a
// new ballot while the leader still counts on the lease. Each trial cuts
// the leader off after its heartbeats queued, resumes the follower, and
// offers it a higher ballot a quarter of a lease later.
func TestStalledFollowerLeaseRunsFromItsStep(t *testing.T) {
	const trials = 6
	early, judged := stalledFollowerTrials(t, trials, false)
	t.Logf("stalled follower: trials=%d judged=%d early_promises=%d", trials, judged, early)
	if early > 0 {
		t.Fatalf("%d of %d resumed followers promised a new ballot inside the lease their ack had just granted", early, judged)
	}
}

// stalledTrialSlowMax is how long a trial may take from the follower's
// release to its stepping the Prepare and still be judged: the lease the
// follower's ack grants runs LeaseTicks from its step, which comes after
// the release, so a trial the machine held up for most of that says
// nothing (a promise then may be due). A trial takes about a third of a
// lease when nothing holds it up (a quarter of a lease of sleep and a few
// milliseconds). A slower one is run again, up to stalledTrialAttemptsPer
// times per trial.
const (
	stalledTrialSlowMax     = testLeaseTicks * time.Millisecond * 3 / 4
	stalledTrialAttemptsPer = 3
)

// TestStalledFollowerPlantedStaleClockCaught: the planted stale clock is
// caught by the follower trials.
func TestStalledFollowerPlantedStaleClockCaught(t *testing.T) {
	TestingStaleClock = true
	defer func() { TestingStaleClock = false }()
	if early, judged := stalledFollowerTrials(t, 12, true); early == 0 {
		t.Fatalf("the planted stale clock made no follower promise early in %d trials", judged)
	}
}

// stalledFollowerTrials runs the trials of
// TestStalledFollowerLeaseRunsFromItsStep and counts early promises among
// the judged ones (those not slower than stalledTrialSlowMax). It fails
// the test when fewer than half the trials could be judged.
func stalledFollowerTrials(t *testing.T, trials int, untilCaught bool) (promised, judged int) {
	for attempt := 0; judged < trials && attempt < trials*stalledTrialAttemptsPer && !(untilCaught && promised > 0); attempt++ {
		trial := judged
		c := newTestCluster(t, 3, 0)
		c.put("k", "v")
		l := c.leader()
		var f, o paxos.NodeID
		for id := range c.nodes {
			switch {
			case id == l:
			case f == 0:
				f = id
			default:
				o = id
			}
		}
		fr := c.nodes[f].r
		release := c.stall(f)
		// Heartbeats from the leader queue while the loop is stalled for
		// well over a lease; then nothing more arrives from the leader.
		time.Sleep(3 * testLeaseTicks * time.Millisecond)
		waitFor(t, "queued heartbeats", func() bool { return len(fr.inbound) > 0 })
		fr.faults.Block(l)
		released := time.Now()
		release()
		time.Sleep(testLeaseTicks * time.Millisecond / 4)
		before := fr.Status().Promised
		higher := paxos.Ballot{Round: before.Round + 100, Node: o}
		fr.inbound <- paxos.Message{Type: paxos.MsgPrepare, Cluster: 9, From: o, To: f, Ballot: higher, Slot: fr.Status().Commit + 1}
		time.Sleep(5 * time.Millisecond)
		waitFor(t, "the prepare to be stepped", func() bool { return len(fr.inbound) == 0 })
		took := time.Since(released)
		time.Sleep(2 * time.Millisecond)
		got := fr.Status().Promised
		for id := range c.nodes {
			c.stop(id)
		}
		if took > stalledTrialSlowMax {
			t.Logf("trial %d: %v from release to the Prepare stepped (over %v): not judged, run again", trial, took, stalledTrialSlowMax)
			continue
		}
		judged++
		if got == higher {
			promised++
			t.Logf("trial %d: follower %d promised %v a quarter lease after acking the leader's heartbeat", trial, f, higher)
		}
	}
	if judged < (trials+1)/2 && !(untilCaught && promised > 0) {
		t.Fatalf("only %d of %d trials ran fast enough to be judged (each within %v from release to the Prepare)", judged, trials, stalledTrialSlowMax)
	}
	return promised, judged
}

// TestAnswerOnlyToOwnCommand: a committed command that names a waiting
// writer's proposal number but is not its command never answers it.
func TestAnswerOnlyToOwnCommand(t *testing.T) {
	r := &Replica{pending: map[uint64]*writeWaiter{}, metrics: NewMetrics(nil), boot: 7}
	own := appendEnvelope(nil, proposalID{origin: 1, boot: 7, seq: 1}, []byte("mine"))
	w := &writeWaiter{ch: make(chan writeResult, 1), env: own}
	r.pending[1] = w
	other := appendEnvelope(nil, proposalID{origin: 1, boot: 7, seq: 1}, []byte("someone else's"))
	r.answer(1, other, writeResult{res: sm.Result{Status: proto.StatusCASMismatch}})
	select {
	case res := <-w.ch:
		t.Fatalf("the writer got another command's result %+v", res)
	default:
	}
	r.answer(1, own, writeResult{})
	if res := <-w.ch; res.err != nil || res.res.Status != proto.StatusOK {
		t.Fatalf("own result: %+v", res)
	}
}

// TestRefusesStateBehindLog: a state machine that is behind the acceptor
// log's truncation point (its directory removed after the log was
// truncated) is refused at start, with an error that says what to do,
// instead of starting paxos at slot 1 below a truncated log.
func TestRefusesStateBehindLog(t *testing.T) {
	c := newTestClusterSized(t, 1, 20, 16<<20)
	for i := 0; i < 60; i++ {
		c.put(fmt.Sprintf("k%d", i), "v")
	}
	r := c.nodes[1].r
	waitFor(t, "the log to truncate", func() bool { return r.alog.TruncatedBelow() > 1 })
	c.stop(1)
	if err := os.RemoveAll(filepath.Join(c.dir, "sm1")); err != nil {
		t.Fatal(err)
	}
	plog, _, err := OpenPMemLog(pmem.Options{Path: filepath.Join(c.pmemDir, "n1.pmem"), SizeBytes: c.pmemBytes,
		Mode: c.pmemMode(), ClusterID: 9, NodeID: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer plog.Close()
	store, err := sm.Open(filepath.Join(c.dir, "sm1"), sm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	_, err = New(Config{ID: 1, ClusterID: 9, Peers: c.peers, Tick: time.Millisecond, ElectionTicks: 100, HeartbeatTicks: 10},
		c.net.Listen(c.peers[0].ConsensusAddr), plog, store)
	if !errors.Is(err, ErrStateBehindLog) {
		t.Fatalf("New with a wiped state machine: %v, want ErrStateBehindLog", err)
	}
	if !bytes.Contains([]byte(err.Error()), []byte("snapshot")) {
		t.Fatalf("the error does not say what to do: %v", err)
	}
}

// TestAccelClosedPathMirrorsReachPromise: a stall closes the follower fast
// path while mirrors of Accepts it already persisted and acknowledged are
// still queued; a higher-ballot Prepare stepped next must get a Promise
// that reports those entries (stepInbound steps queued mirrors first, open
// path or not). Before, only an open path fenced, and the Promise could
// omit a slot the fast path had acknowledged.
func TestAccelClosedPathMirrorsReachPromise(t *testing.T) {
	b := paxos.Ballot{Round: 3, Node: 1}
	r, _ := newFastPathReplica(t, b)
	node, err := paxos.NewNode(paxos.Config{ID: 2, ClusterID: 9, Members: []paxos.NodeID{1, 2, 3},
		ElectionTicks: 100, HeartbeatTicks: 10, ExternalElection: true}, paxos.DurableState{Promised: b})
	if err != nil {
		t.Fatal(err)
	}
	r.node = node
	r.clk.init(time.Millisecond, time.Now)
	m := acceptMsg(b, 1, 2)
	if !r.accel.received(&m, true) {
		t.Fatal("the fast path declined an Accept at the promised ballot")
	}
	<-r.outbound // the fast Accepted: slots 1 and 2 count toward the leader's quorum
	st := paxos.Status{ID: 2, Role: paxos.RoleFollower, Promised: b, Leader: 1}
	r.accel.fast.reopen(&st, false) // a stall closes the path; the mirror stays queued
	higher := paxos.Ballot{Round: 4, Node: 3}
	r.stepInbound(paxos.Message{Type: paxos.MsgPrepare, Cluster: 9, From: 3, To: 2, Ballot: higher, Slot: 1})
	rd := node.Ready()
	for _, out := range rd.Messages {
		if out.Type != paxos.MsgPromise || out.To != 3 || out.Reject {
			continue
		}
		var slots []paxos.Slot
		for _, e := range out.Entries {
			slots = append(slots, e.Slot)
		}
		if len(slots) != 2 || slots[0] != 1 || slots[1] != 2 {
			t.Fatalf("the Promise to %v reports slots %v; the fast path acknowledged 1 and 2", higher, slots)
		}
		return
	}
	t.Fatalf("no Promise for %v in %+v", higher, rd.Messages)
}

// TestAccelWedgedLoopStopsHeartbeats: the plane's heartbeats keep the
// followers loyal through a consensus-loop stall shorter than
// loopWedgedElections election timeouts (TestAccelHeartbeatsDuringStall),
// but not through a wedge: once the loop has not iterated for that long
// the plane withholds its heartbeats and the followers elect a new leader.
func TestAccelWedgedLoopStopsHeartbeats(t *testing.T) {
	on := map[paxos.NodeID]bool{1: true, 2: true, 3: true}
	c := newTestClusterWith(t, func(tc *testCluster) { tc.accelOn = on })
	c.put("before", "1")
	l := c.leader()
	lb := c.nodes[l].r.Status().Ballot
	release := c.stall(l)
	defer release()
	wedge := time.Duration(loopWedgedElections+1) * 100 * time.Millisecond // ElectionTicks 100 x 1ms
	deadline := time.Now().Add(wedge + 20*time.Second)
	for {
		nl, _ := c.leading(lb, l) // a leader elected after l, not one deposed before it
		if nl != 0 {
			st, _ := c.nodes[l].r.AccelStats()
			t.Logf("node %d leads after the leader %d wedged; the plane withheld %d heartbeat rounds", nl, l, st.WedgedHeartbeats)
			if st.WedgedHeartbeats == 0 {
				t.Fatal("a new leader was elected but the wedged leader's plane withheld no heartbeat")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failover while leader %d's consensus loop was wedged", l)
		}
		time.Sleep(5 * time.Millisecond)
	}
	release()
	c.put("after", "1")
}

// TestLeaseValidNowWhileLoopStalls: a leader's Status is its consensus
// loop's view as of its last iteration, so a stalled loop keeps saying
// "leader, lease valid" (an outside tester's /status said leader for 3.4 s
// after another node was elected). LeaseValidNow judges that lease by the
// clock now: true on the leader at rest, false once the stalled loop's
// lease has run out (Role still says leader), and, when the loop runs
// again, it agrees with the node's own view.
func TestLeaseValidNowWhileLoopStalls(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	l := c.leader()
	r := c.nodes[l].r
	deadline := time.Now().Add(5 * time.Second)
	for s := r.Status(); !r.LeaseValidNow(&s); s = r.Status() {
		if time.Now().After(deadline) {
			t.Fatalf("leader %d at rest: lease valid %v (until tick %d), LeaseValidNow false", l, s.LeaseValid, s.LeaseUntil)
		}
		time.Sleep(time.Millisecond)
	}
	release := c.stall(l)
	defer release()
	time.Sleep(3 * testLeaseTicks * time.Millisecond)
	s := r.Status()
	if s.Role != paxos.RoleLeader || !s.LeaseValid {
		t.Fatalf("stalled leader's Status: %v lease %v: want the stale view (leader, valid), or the test shows nothing", s.Role, s.LeaseValid)
	}
	if r.LeaseValidNow(&s) {
		t.Fatalf("loop stalled %v (lease %d ticks): LeaseValidNow still true (until tick %d)", r.LoopIdle().Round(time.Millisecond), testLeaseTicks, s.LeaseUntil)
	}
	if idle := r.LoopIdle(); idle < 2*testLeaseTicks*time.Millisecond {
		t.Fatalf("LoopIdle %v after a stall of %v", idle, 3*testLeaseTicks*time.Millisecond)
	}
	release()
	deadline = time.Now().Add(5 * time.Second)
	for {
		s := r.Status()
		if s.LeaseValid == r.LeaseValidNow(&s) && r.LoopIdle() < time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the stall: Status lease %v, LeaseValidNow %v", s.LeaseValid, r.LeaseValidNow(&s))
		}
		time.Sleep(time.Millisecond)
	}
}
