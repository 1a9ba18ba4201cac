package replica

import (
	"testing"

	"synod/paxos"
)

// newAccelLeader builds just enough of a leader (node 1 of 3, leading at
// b) to drive its accel aggregator wiring directly.
func newAccelLeader(t *testing.T, b paxos.Ballot) *Replica {
	t.Helper()
	r, _ := newAccelTestReplica(t, 1, paxos.Status{ID: 1, Role: paxos.RoleLeader, Ballot: b, Promised: b, Leader: 1, Members: []paxos.NodeID{1, 2, 3}}, b)
	t.Cleanup(func() { r.accel.close() })
	return r
}

// acceptsTo is the leader's Accepts of slots first..first+n-1 to both
// followers.
func acceptsTo(b paxos.Ballot, first paxos.Slot, n int) []paxos.Message {
	var out []paxos.Message
	for _, to := range []paxos.NodeID{2, 3} {
		m := acceptMsg(b, first, n)
		m.From, m.To = 1, to
		out = append(out, m)
	}
	return out
}

func acceptedFrom(b paxos.Ballot, from paxos.NodeID, first, last paxos.Slot) *paxos.Message {
	return &paxos.Message{Type: paxos.MsgAccepted, Cluster: 9, From: from, To: 1, Ballot: b, Slot: first, Index: last}
}

func (a *accelMirror) committedRow(s paxos.Slot, b paxos.Ballot) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	row := &a.props[s&a.mask]
	return row.used && row.slot == s && row.ballot == b && row.committed
}

// TestAccelArmsOnlyOwnDurable: the plane counts the leader's own vote
// (Arm) only once its own write is durable, whichever of send and persist
// comes last; a follower's Accepted that comes before is held and counted
// at the Arm, not lost; a row whose write never became durable while the
// node led excuses software's commit of it (withheld) instead of failing
// the check. With the Arm at send time (the old wiring), the first case
// commits on the plane with one follower and a leader vote that is not
// durable: the test fails.
func TestAccelArmsOnlyOwnDurable(t *testing.T) {
	b := paxos.Ballot{Round: 3, Node: 1}
	t.Run("persist after send", func(t *testing.T) {
		r := newAccelLeader(t, b)
		a := r.accel
		a.sending(acceptsTo(b, 1, 2))
		a.accepted(acceptedFrom(b, 2, 1, 2), false)
		for s := paxos.Slot(1); s <= 2; s++ {
			if a.committedRow(s, b) {
				t.Fatalf("slot %d committed on the plane before the leader's own write was durable", s)
			}
		}
		a.ownDurable([]ownRange{{b: b, first: 1, last: 2}})
		for s := paxos.Slot(1); s <= 2; s++ {
			if !a.committedRow(s, b) {
				t.Fatalf("slot %d: the held Accepted was not counted at the Arm", s)
			}
		}
	})
	t.Run("persist before send", func(t *testing.T) {
		r := newAccelLeader(t, b)
		a := r.accel
		a.ownDurable([]ownRange{{b: b, first: 5, last: 5}})
		if a.committedRow(5, b) {
			t.Fatal("committed before anything was sent")
		}
		a.sending(acceptsTo(b, 5, 1))
		a.accepted(acceptedFrom(b, 3, 5, 5), false)
		if !a.committedRow(5, b) {
			t.Fatal("slot 5 not committed: sent, durable and accepted by a follower")
		}
		// A late report of an older ballot leaves the row alone.
		a.ownDurable([]ownRange{{b: paxos.Ballot{Round: 2, Node: 1}, first: 5, last: 5}})
		if !a.committedRow(5, b) {
			t.Fatal("a stale report took the row over")
		}
	})
	t.Run("never durable", func(t *testing.T) {
		r := newAccelLeader(t, b)
		a := r.accel
		a.sending(acceptsTo(b, 7, 1))
		a.accepted(acceptedFrom(b, 2, 7, 7), false)
		a.accepted(acceptedFrom(b, 3, 7, 7), false)
		if a.committedRow(7, b) {
			t.Fatal("committed without the leader's vote being armed")
		}
		// Software commits with the two followers; then the node steps
		// down before its own write completes.
		a.software([]paxos.AckEvent{{Slot: 7, Ballot: b, From: 2, Committed: true}})
		st := paxos.Status{ID: 1, Role: paxos.RoleFollower, Promised: paxos.Ballot{Round: 4, Node: 2}, Leader: 2, Commit: 7, Members: []paxos.NodeID{1, 2, 3}}
		a.registers(&st)
		res := a.check.result()
		if res.Mismatches != 0 || res.Excused == 0 {
			t.Fatalf("check after a withheld row: %+v", res)
		}
	})
}
