package e2e

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Rounds and pacing of the loopback leader-kill test (the workload itself
// is leaderKillWorkload's).
const (
	killRoundsDefault = 10
	killLoadPerRound  = 250 * time.Millisecond
	killCheckTimeout  = 3 * time.Minute
	// accelSettle lets the last replies' Accepted messages reach both the
	// plane and software before the accel check is read.
	accelSettle = 50 * time.Millisecond
)

// TestLeaderKillLinearizable runs clients against a 3-node cluster while
// the leader is SIGKILLed and restarted, round after round. It checks that
// a new leader serves writes after each kill, the killed node catches up,
// the whole history is linearizable, and no acknowledged write is lost.
func TestLeaderKillLinearizable(t *testing.T) {
	rounds := killRoundsDefault
	if s := os.Getenv("E2E_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("E2E_KILLS=%q", s)
		}
		rounds = n
	}
	c := newCluster(t, 3)
	var (
		accelCommits, accelMismatches int
		accelHandUps                  uint64
	)
	r := leaderKillWorkload(t, c, leaderKills{
		rounds:       rounds,
		seed:         42,
		loadPerRound: killLoadPerRound,
		restart:      c.start,
		describe:     func(*node) string { return "" },
		// The aggregator runs on the leader: take its accel check before
		// the kill wipes it. The clients pause for the reading, so no
		// Accepted is between the plane (receive loop) and software
		// (consensus loop): an in-flight slot is not a disagreement.
		paused: func(l *node) {
			time.Sleep(accelSettle)
			st, err := c.status(l)
			if err == nil && st.Accel != nil {
				accelCommits += st.Accel.Commits
				accelMismatches += st.Accel.Mismatches
				accelHandUps += st.Accel.HandUps
				if st.Accel.Mismatches != 0 {
					t.Errorf("node %d: accel commit mismatch: %s", l.id, st.Accel.First)
				}
			}
		},
	})
	ac, am, ah := c.accelTotals()
	accelCommits, accelMismatches, accelHandUps = accelCommits+ac, accelMismatches+am, accelHandUps+ah
	fmt.Printf("accel: commits=%d mismatches=%d handups=%d\n", accelCommits, accelMismatches, accelHandUps)
	// Node 3 runs without accel and cannot lead twice in a row (it is
	// killed when it leads), so nodes with the plane led some rounds.
	if accelCommits == 0 {
		t.Errorf("accel: no commit was checked on the nodes running the plane")
	}
	h := r.h
	res := h.check(killCheckTimeout)
	lin := res == porcupine.Ok
	fmt.Printf("e2e: nodes=3 kills=%d ops=%d linearizable=%v lost=%d\n", r.kills, len(h.ops), lin, r.lost)
	if !lin {
		path, err := h.visualize(killCheckTimeout)
		t.Fatalf("history of %d ops is not linearizable (porcupine: %v); view: %s (%v)", len(h.ops), res, path, err)
	}
	if r.lost != 0 {
		t.Fatalf("%d acknowledged writes lost", r.lost)
	}
	if r.kills < rounds {
		t.Fatalf("only %d kills", r.kills)
	}
}
