package paxossim

import (
	"strings"
	"testing"

	"synod/paxos"
)

// TestQuorumOracle plants, by hand, the commits the voter-quorum oracle
// exists to catch and the harmless ones it must let through: voters
// {1,2,3}, learner 4.
func TestQuorumOracle(t *testing.T) {
	voters := []paxos.NodeID{1, 2, 3}
	b := paxos.Ballot{Round: 1, Node: 1}
	entry := func(slot paxos.Slot, ballot paxos.Ballot, val string) paxos.Entry {
		return paxos.Entry{Slot: slot, Ballot: ballot, Type: paxos.EntryNormal, Cmds: [][]byte{putCmd(1, uint64(slot), "x", val)}}
	}
	commit := func(slot paxos.Slot, ballot paxos.Ballot) *paxos.AckEvent {
		return &paxos.AckEvent{Slot: slot, Ballot: ballot, From: 2, Count: 2, Committed: true}
	}
	t.Run("voter majority passes", func(t *testing.T) {
		c := newChecker(0)
		c.q().governs(c, 1, voters)
		e := entry(1, b, "a")
		c.accepted(1, &e)
		c.accepted(2, &e)
		c.ack(1, commit(1, b))
		c.applied(3, &e, 1)
		if c.count != 0 || c.q().checks != 2 {
			t.Fatalf("violations %v, checks %d", c.violations, c.q().checks)
		}
	})
	t.Run("learner counted is caught", func(t *testing.T) {
		c := newChecker(0)
		c.q().governs(c, 1, voters)
		e := entry(1, b, "a")
		c.accepted(2, &e)
		c.accepted(4, &e) // the learner: durable, but no vote
		c.ack(1, commit(1, b))
		if c.q().violations != 1 || !strings.Contains(c.violations[0], "leader 1 committed with 1 durable") {
			t.Fatalf("violations %v", c.violations)
		}
		c.applied(2, &e, 1)
		if c.q().violations != 2 || !strings.Contains(c.violations[1], "node 2 applied a value") {
			t.Fatalf("violations %v", c.violations)
		}
	})
	t.Run("own vote counts only when durable", func(t *testing.T) {
		c := newChecker(0)
		c.q().governs(c, 1, voters)
		e := entry(1, b, "a")
		c.accepted(2, &e) // the leader's own write has not completed
		c.q().committed(c, 1, commit(1, b))
		if c.q().violations != 1 {
			t.Fatalf("violations %v", c.violations)
		}
	})
	t.Run("claim waits for its configuration, on the acceptances it was made on", func(t *testing.T) {
		c := newChecker(0)
		c.q().governs(c, 1, voters)
		e := entry(2, b, "a")
		c.accepted(2, &e)
		c.accepted(4, &e)
		c.ack(1, commit(2, b)) // slot 1 not applied anywhere yet
		c.accepted(3, &e)      // a voter majority only after the commit
		if c.count != 0 {
			t.Fatalf("judged before the configuration was known: %v", c.violations)
		}
		c.q().governs(c, 2, voters) // slot 1 applied: slot 2's voters known
		if c.q().violations != 1 {
			t.Fatalf("violations %v, want the waiting claim caught", c.violations)
		}
	})
	t.Run("a configuration change governs only the slots above it", func(t *testing.T) {
		c := newChecker(0)
		c.q().governs(c, 1, voters)
		c.q().governs(c, 2, []paxos.NodeID{1, 2, 3, 4}) // 4 promoted at slot 1
		e1, e2 := entry(1, b, "a"), entry(2, b, "b")
		for _, id := range []paxos.NodeID{1, 4} {
			c.accepted(id, &e1)
			c.accepted(id, &e2)
		}
		c.ack(1, commit(1, b)) // slot 1: 4 is not a voter yet
		if c.q().violations != 1 {
			t.Fatalf("slot 1: violations %v", c.violations)
		}
		c.accepted(2, &e2)
		c.ack(1, commit(2, b)) // slot 2: {1,2,4} of four voters
		if c.q().violations != 1 {
			t.Fatalf("slot 2: violations %v", c.violations)
		}
	})
	t.Run("a follower acking a slot chosen under an older ballot is harmless", func(t *testing.T) {
		c := newChecker(0)
		c.q().governs(c, 1, voters)
		old, b2 := entry(1, b, "a"), entry(1, paxos.Ballot{Round: 2, Node: 2}, "a")
		c.accepted(1, &old)
		c.accepted(3, &old) // chosen at ballot 1.1
		c.accepted(2, &b2)  // the new leader's own; 3 acks from its commit
		c.ack(2, &paxos.AckEvent{Slot: 1, Ballot: b2.Ballot, From: 3, Count: 2, Committed: true})
		if c.count != 0 {
			t.Fatalf("violations %v", c.violations)
		}
	})
}
