package replica

import (
	"fmt"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/paxos"
)

// TestOwnEntriesWaitForRoom: a leader whose acceptor log refuses its own
// acceptance keeps leading (its Ready does not stall: the Accepts leave,
// the followers' answers are stepped, heartbeats go on), and once the log
// has room again the waiting entry is stored, the leader's vote counts and
// the write is answered. Planted (testingNoOwnBacklog, the old stall): the
// Ready stalls and the leader steps down (the wedge of own_backlog.go,
// where no node had room to un-stall).
func TestOwnEntriesWaitForRoom(t *testing.T) {
	// Up to three tries: on a loaded CI machine the leader may lose a
	// term for reasons of its own (a starved tick), which fails the
	// write; a stall (the bug) fails every try.
	line, kept := ownBacklogRun(t)
	for try := 1; try < 3 && !kept; try++ {
		t.Logf("try %d: %s", try, line)
		line, kept = ownBacklogRun(t)
	}
	if !kept {
		t.Fatalf("own entries with no room: %s, want the leader to keep leading without a stall and answer the write", line)
	}
	testingNoOwnBacklog = true
	defer func() { testingNoOwnBacklog = false }()
	pLine, pKept := ownBacklogRun(t)
	if pKept {
		t.Fatalf("planted (no backlog): %s: the leader did not stall, the test does not show the wedge", pLine)
	}
	fmt.Printf("own backlog: %s; planted (own entries stall the Ready): %s\n", line, pLine)
}

func ownBacklogRun(t *testing.T) (line string, kept bool) {
	c, full := newSwitchedFullCluster(t)
	defer c.stopAll() // the caller changes a testing knob next
	c.put("before", "1")
	l := c.leader()
	r := c.nodes[l].r
	full[l].Store(true)
	done := make(chan proto.Status, 1)
	go func() { done <- c.do(l, putReq("waits", "1"), 20*time.Second).Status }()
	// Long enough for check quorum to depose a stalled leader, well short
	// of the stuck detector's hand-over (stuck.go).
	time.Sleep(time.Duration(6*c.election()) * time.Millisecond)
	stalls, role := counterValue(r.metrics.LogStalls), r.Status().Role
	select {
	case st := <-done:
		full[l].Store(false)
		return fmt.Sprintf("answered %v while the log had no room", st), false
	default:
	}
	full[l].Store(false)
	start := time.Now()
	var st proto.Status
	select {
	case st = <-done:
	case <-time.After(20 * time.Second):
		return fmt.Sprintf("stalls=%v role_while_full=%v: no answer 20s after the log had room", stalls, role), false
	}
	after := r.Status()
	line = fmt.Sprintf("stalls=%v role_while_full=%v write=%v answered_after_room=%v leader_after=%d",
		stalls, role, st, time.Since(start).Round(time.Millisecond), after.Leader)
	return line, stalls == 0 && role == paxos.RoleLeader && st == proto.StatusOK && after.Leader == l
}

// TestTailGivesWayToOwnBacklog: compaction keeps a catch-up tail of
// committed slots (CatchUpLogPercent of the log), but not while the
// node's own acceptances wait for room: then it compacts through the
// snapshot's slot. Planted (testingTailKeptForBacklog): the tail stays.
func TestTailGivesWayToOwnBacklog(t *testing.T) {
	floors := func() (idle, waiting paxos.Slot) {
		const capacity = 1 << 20
		r := &Replica{alog: newSimLog(capacity), cfg: Config{CatchUpLogPercent: 40, SnapshotEverySlots: 1 << 20}}
		for s := paxos.Slot(1); s <= 100; s++ {
			r.logTail.appended(8<<10, s, capacity) // 800 KiB of committed entries
		}
		idle = r.catchUpFloor(100)
		r.ownBacklog.entries = []paxos.Entry{{Slot: 101}}
		return idle, r.catchUpFloor(100)
	}
	idle, waiting := floors()
	if idle >= 100 || waiting != 100 {
		t.Fatalf("compaction through %d with no backlog (want a tail below 100), through %d with one (want 100)", idle, waiting)
	}
	testingTailKeptForBacklog = true
	defer func() { testingTailKeptForBacklog = false }()
	_, pWaiting := floors()
	if pWaiting == 100 {
		t.Fatal("planted (tail kept): compaction still went through 100: the test does not show the tail")
	}
	fmt.Printf("tail and backlog: compacts_through=%d with no backlog, %d with own entries waiting; planted (tail kept): %d\n", idle, waiting, pWaiting)
}
