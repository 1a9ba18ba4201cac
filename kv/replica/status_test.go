package replica

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/client"
	"synod/kv/proto"
	"synod/kv/server"
	"synod/paxos"
	"synod/tenants"
)

func (c *testCluster) status(id paxos.NodeID, format uint8) *proto.ClusterStatus {
	c.t.Helper()
	resp := c.do(id, &proto.Request{Op: proto.OpStatus, Tenant: testTenant, StatusFormat: format}, 2*time.Second)
	if resp.Status != proto.StatusOK || resp.Cluster == nil {
		c.t.Fatalf("STATUS on %d: %v %s", id, resp.Status, resp.Message)
	}
	// What a client decodes: the frame round trip applies the wire's rules
	// (unknown figures zeroed).
	got, _, err := proto.DecodeResponseFrame(proto.AppendResponse(nil, &proto.Response{Op: proto.OpStatus, Cluster: resp.Cluster}))
	if err != nil {
		c.t.Fatalf("STATUS on %d does not decode: %v", id, err)
	}
	return got.Cluster
}

func rowOf(t *testing.T, cs *proto.ClusterStatus, id paxos.NodeID) proto.MemberStatus {
	t.Helper()
	for _, m := range cs.Members {
		if m.ID == uint64(id) {
			return m
		}
	}
	t.Fatalf("no row for %d in %+v", id, cs.Members)
	return proto.MemberStatus{}
}

// waitStatus polls STATUS on id until ok accepts it (a heartbeat or two may
// be needed for the figures to settle on a loaded machine).
func (c *testCluster) waitStatus(id paxos.NodeID, what string, ok func(*proto.ClusterStatus) error) *proto.ClusterStatus {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		cs := c.status(id, proto.StatusFormatProgress)
		err := ok(cs)
		if err == nil {
			return cs
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: %v\nstatus: %+v", what, err, cs.Members)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStatusLeaderView: the leader's STATUS rows for its followers carry
// real roles, slots, reachability and lag; a follower marks what it cannot
// know as unknown; a stopped member shows unreachable and falls behind.
func TestStatusLeaderView(t *testing.T) {
	c := newTestCluster(t, 3, 0)
	l := c.leader()
	for i := 0; i < 20; i++ {
		c.put(fmt.Sprintf("k%d", i), "v")
	}
	var followers []paxos.NodeID
	for id := range c.nodes {
		if id != l {
			followers = append(followers, id)
		}
	}
	healthy := func(cs *proto.ClusterStatus) error {
		if !cs.Extended || len(cs.Members) != 3 {
			return fmt.Errorf("extended=%v with %d rows", cs.Extended, len(cs.Members))
		}
		self := rowOf(t, cs, l)
		if self.Role != proto.RoleLeader || self.Commit == 0 || self.Known&proto.KnownApplied == 0 {
			return fmt.Errorf("leader's own row %+v", self)
		}
		for _, f := range followers {
			m := rowOf(t, cs, f)
			switch {
			case m.Role != proto.RoleFollower || m.Known&proto.KnownRole == 0:
				return fmt.Errorf("follower %d: role %v", f, m.Role)
			case m.Ballot != self.Ballot:
				return fmt.Errorf("follower %d: ballot %v, leader's %v", f, m.Ballot, self.Ballot)
			case !m.Reachable || m.Known&proto.KnownReachable == 0:
				return fmt.Errorf("follower %d: not reachable", f)
			case m.Commit != self.Commit || m.Acked < self.Commit:
				return fmt.Errorf("follower %d: commit %d acked %d, leader's commit %d", f, m.Commit, m.Acked, self.Commit)
			case m.Known&proto.KnownApplied != 0 || m.Applied != 0:
				return fmt.Errorf("follower %d: the leader claims to know its applied slot", f)
			case m.Known&proto.KnownHeard == 0 || m.HeardAgo > time.Second:
				return fmt.Errorf("follower %d: heard %v ago (known %v)", f, m.HeardAgo, m.Known&proto.KnownHeard != 0)
			case m.Lag != 0 || m.LagAtLeast:
				return fmt.Errorf("follower %d: lag %v", f, m.Lag)
			}
		}
		return nil
	}
	cs := c.waitStatus(l, "leader's view of a healthy cluster", healthy)
	t.Logf("leader %d's view: %+v", l, cs.Members)

	// The basic reply (an old client) carries the same known figures.
	basic := c.status(l, 0)
	if basic.Extended || rowOf(t, basic, followers[0]).Role != proto.RoleFollower || rowOf(t, basic, followers[0]).Commit == 0 {
		t.Fatalf("basic reply from the leader: %+v", basic.Members)
	}

	// A follower: its own row in full, the leader's role and reachability,
	// and everything else unknown rather than zero.
	f := followers[0]
	c.waitStatus(f, "follower's view", func(cs *proto.ClusterStatus) error {
		if own := rowOf(t, cs, f); own.Role != proto.RoleFollower || own.Known&proto.KnownApplied == 0 {
			return fmt.Errorf("own row %+v", own)
		}
		lr := rowOf(t, cs, l)
		if lr.Role != proto.RoleLeader || !lr.Reachable || lr.Known&proto.KnownHeard == 0 {
			return fmt.Errorf("leader's row %+v", lr)
		}
		if lr.Known&(proto.KnownCommit|proto.KnownApplied|proto.KnownAcked|proto.KnownLag) != 0 {
			return fmt.Errorf("the follower claims to know the leader's slots: known %#x", lr.Known)
		}
		other := rowOf(t, cs, followers[1])
		if other.Known&^proto.KnownHeard != 0 || other.Role != proto.RoleUnknown || other.Commit != 0 {
			return fmt.Errorf("the other follower's row is not unknown: %+v", other)
		}
		return nil
	})

	// Stop a follower; the leader goes on committing and sees it fall
	// behind, unreachable.
	down := followers[1]
	c.stop(down)
	for i := 0; i < 10; i++ {
		c.put(fmt.Sprintf("after%d", i), "v")
	}
	cs = c.waitStatus(l, "leader's view of a stopped follower", func(cs *proto.ClusterStatus) error {
		self, m := rowOf(t, cs, l), rowOf(t, cs, down)
		switch {
		case m.Reachable || m.Known&proto.KnownReachable == 0:
			return errors.New("still reachable")
		case m.Role != proto.RoleUnknown:
			return fmt.Errorf("role %v for a member that does not answer", m.Role)
		case m.Commit >= self.Commit:
			return fmt.Errorf("commit %d, leader's %d: no lag in slots", m.Commit, self.Commit)
		case m.Lag <= 0 || m.HeardAgo < time.Duration(c.election())*time.Millisecond:
			return fmt.Errorf("lag %v, heard %v ago", m.Lag, m.HeardAgo)
		}
		return nil
	})
	m := rowOf(t, cs, down)
	t.Logf("status: stopped follower %d: lag %d slots, %v (at least: %v), heard %v ago, reachable=%v",
		down, rowOf(t, cs, l).Commit-m.Commit, m.Lag, m.LagAtLeast, m.HeardAgo, m.Reachable)

	// Leadership moves to the other follower: the new leader tracks the
	// stopped member but never heard from it, so its slots are unknown
	// there, not slot 0 (an outside tester's kvctl printed COMMIT 0 and a
	// lag of 93,398 slots for a member that held 91,964; planted with
	// paxos.TestingReportUnanswered, caught).
	nl := followers[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.nodes[l].r.TransferLeadership(ctx, nl); err != nil {
		t.Fatalf("transfer to %d: %v", nl, err)
	}
	c.waitStatus(nl, "a new leader's view of a member down since before it led", func(cs *proto.ClusterStatus) error {
		if self := rowOf(t, cs, nl); self.Role != proto.RoleLeader {
			return fmt.Errorf("node %d does not lead yet: %+v", nl, self)
		}
		m := rowOf(t, cs, down)
		switch {
		case m.Known&(proto.KnownCommit|proto.KnownAcked|proto.KnownLag) != 0 || m.Commit != 0 || m.Acked != 0:
			return fmt.Errorf("slots known (%#x) for a member that never answered this leader: commit %d acked %d", m.Known, m.Commit, m.Acked)
		case m.Reachable || m.Known&proto.KnownReachable == 0:
			return fmt.Errorf("reachable=%v known=%#x", m.Reachable, m.Known)
		}
		return nil
	})
	// MEMBER_LIST says the same: not tracked, its commit unknown.
	for _, mi := range NewBackend(c.nodes[nl].r, c.nodes[nl].sm).membershipReply(ctx).Members {
		if mi.ID == uint64(down) && (mi.Tracked || mi.Commit != 0) {
			t.Fatalf("MEMBER_LIST row of the member down since before this leader: %+v", mi)
		}
	}
}

// TestManyWritersOneClientCluster: 600 concurrent writers on one client
// against a 3-node cluster through the real server: none of them is
// answered SEQUENCE_STALE (the client keeps its sequences within the
// server's exactly-once window), and every write applies once.
func TestManyWritersOneClientCluster(t *testing.T) {
	const (
		writers         = 600
		writesPerWriter = 5
	)
	c := newTestCluster(t, 3, 0)
	l := c.leader()
	reg, err := tenants.NewRegistry([]tenants.Spec{{ID: testTenant, Name: "t", Token: "status-test-token"}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Config{}, reg, c.nodes[l].be, zerolog.Nop())
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	ctx := context.Background()
	cl, err := client.Dial(ctx, []string{ln.Addr().String()}, "status-test-token", client.Options{RequestTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var stale, failed atomic.Int64
	var firstErr atomic.Pointer[string] // a string: atomic.Value panics on a second concrete error type
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < writesPerWriter; i++ {
				k := []byte(fmt.Sprintf("w%03d-%d", w, i))
				err := cl.CAS(ctx, k, nil, k) // create-if-absent: twice would fail
				switch {
				case errors.Is(err, client.ErrSequenceStale):
					stale.Add(1)
				case err != nil:
					failed.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("cluster writers: writers=%d writes=%d stale=%d failed=%d", writers, writers*writesPerWriter, stale.Load(), failed.Load())
	if n := stale.Load(); n != 0 {
		t.Errorf("%d writes answered SEQUENCE_STALE; want 0", n)
	}
	if n := failed.Load(); n != 0 {
		// A leader change under load is possible on a loaded machine;
		// the client's own window is what this test is about.
		t.Logf("%d writes failed (first: %s)", n, *firstErr.Load())
	}
}
