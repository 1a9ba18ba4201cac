package replica

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/paxos"
)

// TestStuckLeaderWithSlotsInFlightHandsOver: the wedge of e2e
// TestFullLogStaysLive (CI, 2026-12-07), in one process. There the new
// leader's own re-proposals waited 60 s for room in its full acceptor log,
// one follower's log was as full, and nothing committed; the leader was
// stuck and started a hand-over every 2 s, but the operator's hand-over
// waits until nothing is in flight (commit == last slot), which could not
// happen, so each was abandoned. Here the leader's own persist hangs (its
// vote for the new slot never counts) and one follower is cut off from
// it, so the slot stays in flight with the other follower's vote alone.
// The leader must count itself stuck (the own-vote check: its own writes
// not durable, none reported, for stuckAfter), hand over at once to the
// follower it still reaches, and that node must be elected with the cut
// one, find the slot in flight in phase 1, commit it and serve writes, all
// inside the hang.
//
// Planted, each alone must leave the cluster without a new leader for the
// whole hang: the operator's hand-over (testingStuckHandOverWaits), and
// the watch without its own-vote check (testingNoOwnVoteStuck).
func TestStuckLeaderWithSlotsInFlightHandsOver(t *testing.T) {
	const hang = 12 * time.Second
	took, line := stuckWithSlotInFlight(t, hang)
	if took == 0 || took >= hang {
		t.Fatalf("no new leader within the %v hang: %s", hang, line)
	}
	planted := map[string]string{}
	for name, flag := range map[string]interface{ Store(bool) }{
		"hand-over waits": &testingStuckHandOverWaits, "no own-vote check": &testingNoOwnVoteStuck,
	} {
		pTook, pLine := withPlant(t, flag, func() (time.Duration, string) { return stuckWithSlotInFlight(t, hang) })
		if pTook != 0 && pTook < hang {
			t.Fatalf("planted (%s): a new leader after %v, inside the hang: the test does not show the wedge (%s)", name, pTook, pLine)
		}
		planted[name] = pLine
	}
	fmt.Printf("stuck leader with a slot in flight: %s; planted hand-over waits: %s; planted no own-vote check: %s\n",
		line, planted["hand-over waits"], planted["no own-vote check"])
}

// stuckWithSlotInFlight runs the scenario above on a fresh cluster and
// returns how long after the put a new leader served a write (0: none
// within hang) and a summary line. The slot in flight must end applied on
// every node either way.
func stuckWithSlotInFlight(t *testing.T, hang time.Duration) (time.Duration, string) {
	t.Helper()
	c := newTestCluster(t, 3, 0)
	defer c.stopAll()
	return runInflightWedge(t, c, hang, inflightWedge{
		before: func(old paxos.NodeID) { c.nodes[old].r.faults.DelayNextPersist(hang) },
	})
}

// withPlant runs run with the planted flag set, and clears it after, also
// when run fails the test (a later -count run must not find it set).
func withPlant(t *testing.T, flag interface{ Store(bool) }, run func() (time.Duration, string)) (time.Duration, string) {
	flag.Store(true)
	t.Cleanup(func() { flag.Store(false) })
	defer flag.Store(false)
	return run()
}

// inflightWedge is what makes the leader's own vote wait in one of the
// scenarios runInflightWedge runs (nil: nothing to do at that step).
type inflightWedge struct {
	before func(old paxos.NodeID)                         // before the put is sent
	sent   func(old, reach paxos.NodeID, base paxos.Slot) // after it is sent; base is the last acknowledged slot
	end    func(old paxos.NodeID)                         // once the run is over
}

// runInflightWedge is the scenario of both tests, on cluster c: healthy disk
// reports everywhere, a put acknowledged, one follower cut off from the
// leader, the wedge, a put sent to the leader (it stays in flight), then a
// write through any other node that leads, tried until one is acknowledged
// or hold passes. Then the wedge ends and the cut heals, and the put in
// flight must be applied everywhere when it was answered OK or a new
// leader took over. It returns how long after the put a new leader served
// a write (0: none within hold) and a summary line.
func runInflightWedge(t *testing.T, c *testCluster, hold time.Duration, w inflightWedge) (time.Duration, string) {
	t.Helper()
	for _, nd := range c.nodes {
		nd.r.ShareDiskSpace(func() DiskSpace { return DiskSpace{FreeBytes: 1 << 30} })
	}
	old := c.servingLeader("before", "0")
	base := paxos.Slot(c.nodes[old].r.Applied()) // "before"'s slot: answered once applied
	var reach, cut paxos.NodeID
	for id := range c.nodes {
		switch {
		case id == old:
		case reach == 0:
			reach = id
		default:
			cut = id
		}
	}
	c.nodes[old].r.faults.Block(cut)
	c.nodes[cut].r.faults.Block(old)
	if w.before != nil {
		w.before(old)
	}
	began := time.Now()
	answered := make(chan proto.Status, 1)
	go func() { answered <- c.do(old, putReq("inflight", "1"), hold+5*time.Second).Status }()
	if w.sent != nil {
		w.sent(old, reach, base)
	}

	var took time.Duration
	var next paxos.NodeID
	for time.Since(began) < hold && took == 0 {
		for id, nd := range c.nodes {
			if id != old && nd.r.Status().Role == paxos.RoleLeader {
				if resp := c.do(id, putReq("after", "2"), time.Second); resp.Status == proto.StatusOK {
					took, next = time.Since(began), id
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	stuck := c.nodes[old].r.Stuck()
	started := counterValue(c.nodes[old].r.metrics.Stuck.Transfers.WithLabelValues("started"))

	// The wedge ends and the cut heals: the slot in flight is applied
	// everywhere, once, whoever leads.
	if w.end != nil {
		w.end(old)
	}
	c.nodes[old].r.faults.HealAll()
	c.nodes[cut].r.faults.HealAll()
	st := <-answered
	lead := c.leader()
	c.putVia(lead, "last", "3")
	for id := range c.nodes {
		c.waitApplied(id, c.nodes[lead].r.Applied())
	}
	// The follower it reached accepted the slot in flight, so the new
	// leader's phase 1 finds it: applied whatever its answer (UNAVAILABLE
	// is "outcome unknown", docs/protocol.md).
	if got := c.get("inflight"); got != "1" && (st == proto.StatusOK || took != 0) {
		t.Fatalf("the put in flight (answered %v) reads %q after the hand-over", st, got)
	}
	line := fmt.Sprintf("leader=%d cut=%d new_leader=%d served_after=%v stuck=%v hand_overs_started=%v inflight_put=%v",
		old, cut, next, took.Round(time.Millisecond), stuck, started, st)
	t.Log(line)
	return took, line
}

// frozenLog is an acceptor log whose appends fail with ErrLogFull while
// frozen is set, and which reports itself full while full is set: the
// full log of the wedge without filling one.
type frozenLog struct {
	AcceptorLog
	frozen, full *atomic.Bool
}

func (l frozenLog) Append(entries []paxos.Entry) error {
	if l.frozen.Load() {
		return fmt.Errorf("%w: frozen by the test", ErrLogFull)
	}
	return l.AcceptorLog.Append(entries)
}

func (l frozenLog) Usage() (used, capacity int64) {
	used, capacity = l.AcceptorLog.Usage()
	if l.full.Load() {
		used = capacity
	}
	return used, capacity
}

// TestFullLogLeaderHandsOverAtOnce: the wedge of e2e TestFullLogStaysLive
// by its own mechanism. The leader's acceptor log is full (frozen), so its
// own acceptance of a new slot waits in the own backlog for room and its
// vote never counts; one follower is cut off from it; the slot stays in
// flight. The leader is stuck (its log full with nothing truncated, its
// own writes never durable) and must hand over at once to the follower it
// reaches, which is elected with the cut one and commits the slot, inside
// holdFor. Planted (testingStuckHandOverWaits: the operator's hand-over,
// which waits for commit == last slot): no new leader in holdFor, the
// hand-over started and abandoned again and again, as in CI.
func TestFullLogLeaderHandsOverAtOnce(t *testing.T) {
	const holdFor = 12 * time.Second
	took, line := fullLogLeader(t, holdFor)
	if took == 0 || took >= holdFor {
		t.Fatalf("no new leader within %v: %s", holdFor, line)
	}
	pTook, pLine := withPlant(t, &testingStuckHandOverWaits, func() (time.Duration, string) { return fullLogLeader(t, holdFor) })
	if pTook != 0 && pTook < holdFor {
		t.Fatalf("planted (hand-over waits): a new leader after %v: the test does not show the wedge (%s)", pTook, pLine)
	}
	fmt.Printf("full-log leader: %s; planted hand-over waits: %s\n", line, pLine)
}

func fullLogLeader(t *testing.T, holdFor time.Duration) (time.Duration, string) {
	t.Helper()
	var frozen, full [4]atomic.Bool
	c := newTestClusterWith(t, func(c *testCluster) {
		c.wrapLog = func(id paxos.NodeID, l AcceptorLog) AcceptorLog {
			return frozenLog{AcceptorLog: l, frozen: &frozen[id], full: &full[id]}
		}
	})
	defer c.stopAll()
	return runInflightWedge(t, c, holdFor, inflightWedge{
		before: func(old paxos.NodeID) { frozen[old].Store(true) },
		// The put is proposed (its Accepts left, its own copy waits for
		// room: the follower it reaches holds a slot past "before"), and
		// only then does the log report itself full: a log reported full
		// first refuses the put before it is proposed. (The leader's own
		// published status can lag its commit index, so it cannot tell.)
		sent: func(old, reach paxos.NodeID, base paxos.Slot) {
			waitFor(t, "the put in flight, accepted by the follower the leader reaches", func() bool {
				return c.nodes[reach].r.Status().LastSlot > base
			})
			full[old].Store(true)
		},
		end: func(old paxos.NodeID) { frozen[old].Store(false); full[old].Store(false) },
	})
}
