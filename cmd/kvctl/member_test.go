package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"synod/kv/proto"
)

// TestPrintMembership: the table names the leader, each member's role,
// addresses, and, only where the leader tracks it, commit and
// reachability (unknown is "?").
func TestPrintMembership(t *testing.T) {
	var out bytes.Buffer
	err := printMembership(&out, &proto.MembershipReply{Leader: 1, Slot: 42, Pending: true, Members: []proto.MemberInfo{
		{ID: 1, ConsensusAddr: "10.0.0.1:7011", ClientAddr: "10.0.0.1:7001", Tracked: true, Reachable: true, Commit: 100},
		{ID: 4, Learner: true, ConsensusAddr: "10.0.0.4:7011", ClientAddr: "10.0.0.4:7001"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"leader 1, membership from slot 42, a change or transfer in progress\n",
		"1   voter (leader)  10.0.0.1:7011  10.0.0.1:7001  100     true",
		"4   learner         10.0.0.4:7011  10.0.0.4:7001  ?       ?",
	} {
		if !strings.Contains(got, want) {
			t.Fatalf("missing %q in:\n%s", want, got)
		}
	}
	if v, l := parseIDs(got); v != "1" || l != "4" {
		t.Fatalf("voters %q learners %q", v, l)
	}
	if err := printMembership(&out, nil); err == nil {
		t.Fatal("a nil membership printed")
	}
}

// parseIDs is a small reader of the table for the test.
func parseIDs(table string) (voters, learners string) {
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[1] {
		case "voter":
			voters += f[0]
		case "learner":
			learners += f[0]
		}
	}
	return voters, learners
}

// TestMemberArgs: node ids are positive integers; the admin token comes
// from exactly one of the flag, the file or the environment, and is
// required.
func TestMemberArgs(t *testing.T) {
	for _, bad := range []string{"0", "-1", "x", ""} {
		if _, err := parseMemberID(bad); err == nil {
			t.Fatalf("id %q accepted", bad)
		}
	}
	if id, err := parseMemberID("7"); err != nil || id != 7 {
		t.Fatalf("id 7: %d %v", id, err)
	}
	t.Setenv(envAdminToken, "")
	if _, err := (&memberFlags{}).adminToken(); err == nil || !strings.Contains(err.Error(), "admin token") {
		t.Fatalf("no admin token: %v", err)
	}
	file := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(file, []byte("  from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := (&memberFlags{tokenFile: file}).adminToken(); err != nil || tok != "from-file" {
		t.Fatalf("token file: %q %v", tok, err)
	}
	if _, err := (&memberFlags{token: "a", tokenFile: file}).adminToken(); err == nil {
		t.Fatal("both --admin-token and --admin-token-file accepted")
	}
	t.Setenv(envAdminToken, "from-env")
	if tok, err := (&memberFlags{}).adminToken(); err != nil || tok != "from-env" {
		t.Fatalf("token from the environment: %q %v", tok, err)
	}
}
