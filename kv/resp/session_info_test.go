package resp

import (
	"testing"
	"time"

	"synod/kv/proto"
)

// TestInfoMemberLeavesOutUnknown: INFO replication prints only the
// figures the answering node knows of a member; a follower's row of the
// leader (role and reachability known, commit and applied not) must not
// say commit=0,applied=0, which reads as slot 0.
func TestInfoMemberLeavesOutUnknown(t *testing.T) {
	leaderSeenByFollower := proto.MemberStatus{ID: 1, Addr: "127.0.0.1:7001", Role: proto.RoleLeader, Reachable: true,
		HeardAgo: 3 * time.Millisecond, Known: proto.KnownRole | proto.KnownReachable | proto.KnownHeard}
	if got, want := infoMember(0, leaderSeenByFollower), "member0:id=1,addr=127.0.0.1:7001,role=leader,reachable=true,heard_ms=3\r\n"; got != want {
		t.Fatalf("a follower's row of the leader: %q, want %q", got, want)
	}
	nothing := proto.MemberStatus{ID: 3, Addr: "127.0.0.1:7003"}
	if got, want := infoMember(2, nothing), "member2:id=3,addr=127.0.0.1:7003,role=unknown\r\n"; got != want {
		t.Fatalf("a row with nothing known: %q, want %q", got, want)
	}
	own := proto.MemberStatus{ID: 2, Addr: "a", Role: proto.RoleFollower, Commit: 0, Applied: 0, Reachable: true,
		Known: proto.KnownRole | proto.KnownCommit | proto.KnownApplied | proto.KnownReachable}
	if got, want := infoMember(1, own), "member1:id=2,addr=a,role=follower,commit=0,applied=0,reachable=true\r\n"; got != want {
		t.Fatalf("an own row at slot 0 (known): %q, want %q", got, want)
	}
}
