package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"synod/kv/proto"
)

// TestPrintStatusLeaderView: lag in slots and time, last heard and
// reachability come from the leader's view; what nobody knows prints "?".
func TestPrintStatusLeaderView(t *testing.T) {
	all := proto.KnownRole | proto.KnownCommit | proto.KnownApplied | proto.KnownReachable | proto.KnownAcked | proto.KnownHeard | proto.KnownLag
	view := &proto.ClusterStatus{Self: 1, LeaderID: 1, LeaderAddr: "a:1", Ballot: proto.Ballot{Round: 4, Node: 1}, Extended: true,
		Members: []proto.MemberStatus{
			{ID: 1, Addr: "a:1", Role: proto.RoleLeader, Ballot: proto.Ballot{Round: 4, Node: 1}, Commit: 900, Applied: 899, Reachable: true, Known: all},
			{ID: 2, Addr: "a:2", Role: proto.RoleFollower, Ballot: proto.Ballot{Round: 4, Node: 1}, Commit: 900, Reachable: true, Acked: 905,
				Known: all &^ proto.KnownApplied, HeardAgo: 3 * time.Millisecond},
			{ID: 3, Addr: "a:3", Commit: 640, Acked: 640, Known: all &^ (proto.KnownApplied | proto.KnownRole),
				HeardAgo: 12 * time.Second, Lag: 1280 * time.Millisecond, LagAtLeast: true},
		}}
	rows := []statusRow{{MemberStatus: view.Members[0], answered: true}, {MemberStatus: view.Members[1]}, {MemberStatus: view.Members[2]}}
	// Member 2 answered kvctl with its own figures.
	rows[1].Applied, rows[1].Known, rows[1].answered = 897, rows[1].Known|proto.KnownApplied, true
	var out bytes.Buffer
	if err := printStatus(&out, view, rows); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	t.Logf("\n%s", got)
	lines := strings.Split(strings.TrimSpace(got), "\n")
	want := [][]string{
		{"1", "a:1", "leader", "4.1", "900", "899", "0", "0s", "-", "true"},
		{"2", "a:2", "follower", "4.1", "900", "897", "0", "0s", "3ms", "ago", "true"},
		{"3", "a:3", "?", "?", "640", "?", "260", ">=1.28s", "12s", "ago", "false"},
	}
	for i, w := range want {
		f := strings.Fields(lines[len(lines)-3+i])
		if strings.Join(f, " ") != strings.Join(w, " ") {
			t.Errorf("row %d: %q, want %q", i+1, f, w)
		}
	}
}

// TestPrintStatusBasicReply: a server without the progress extension gets
// the old table, and a note that lag and last-heard are not reported.
func TestPrintStatusBasicReply(t *testing.T) {
	view := &proto.ClusterStatus{Self: 2, LeaderID: 1, LeaderAddr: "a:1",
		Members: []proto.MemberStatus{{ID: 1, Addr: "a:1", Role: proto.RoleLeader, Reachable: true}, {ID: 2, Addr: "a:2", Role: proto.RoleFollower, Commit: 5, Applied: 5, Reachable: true}}}
	rows := []statusRow{{MemberStatus: view.Members[0]}, {MemberStatus: view.Members[1], answered: true}}
	var out bytes.Buffer
	if err := printStatus(&out, view, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "predates the progress extension") || !strings.Contains(out.String(), "follower") {
		t.Fatalf("basic reply printed:\n%s", out.String())
	}
}
