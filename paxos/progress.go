package paxos

import "slices"

// This file is what a node knows of its peers' progress, for observers
// (STATUS, kvctl status): when it last heard from each, and, on the
// leader, how far each has replicated. It is read-only with respect to the
// protocol: nothing here changes what the node decides. Times are in the
// node's own ticks; the runtime converts them with its tick period.

// heardNodesMax bounds the senders whose last message time a node keeps:
// the membership and nodes about to join or just removed fit many times.
const heardNodesMax = 4 * MembersMax

// PeerProgress is what this node knows of another member.
type PeerProgress struct {
	ID NodeID
	// Learner says ID is a learner of the latest membership (it counts in
	// no quorum); otherwise it is a voter.
	Learner bool
	// Heard says a valid message from ID reached this node (in any role);
	// HeardAgoTicks is how many ticks ago the last one did.
	Heard         bool
	HeardAgoTicks int64

	// Tracked says this node leads and tracks ID's replication; the
	// fields below are set only then (zero otherwise: unknown, not zero).
	Tracked bool
	// Reported says ID answered this leader (a heartbeat or an Accept):
	// Commit, Acked and LagTicks are then ID's figures. A tracked member
	// that never answered (down since this node began to lead) has them
	// zero, unknown, not slot 0.
	Reported bool
	// Commit is ID's commit index as it last reported it (in a heartbeat
	// answer or an Accepted).
	Commit Slot
	// Acked is the highest slot ID is known to hold: the higher of Commit
	// and the highest slot it acknowledged under the leader's ballot among
	// the slots the leader still tracks.
	Acked Slot
	// Active says ID answered since the leader's last check-quorum.
	Active bool
	// LagTicks is how long ago the leader's commit index passed Commit (0
	// when Commit is the leader's commit, or it passed it less than a
	// heartbeat period ago). With LagAtLeast the leader's heartbeat
	// history does not reach back that far and LagTicks is its span, a
	// lower bound.
	LagTicks   int64
	LagAtLeast bool
}

// noteHeard records that a valid message from id arrived now (Step).
func (n *Node) noteHeard(id NodeID) {
	if n.heard == nil {
		n.heard = make(map[NodeID]int64, 2*MembersMax)
	}
	if _, ok := n.heard[id]; !ok && len(n.heard) >= heardNodesMax {
		// Full: forget senders that are no longer members.
		members := slices.Concat(n.conf.latest(), n.conf.latestLearners())
		for x := range n.heard {
			if !slices.Contains(members, x) {
				delete(n.heard, x)
			}
		}
		if len(n.heard) >= heardNodesMax {
			return
		}
	}
	n.heard[id] = n.now
}

// PeerProgress returns what this node knows of every other member of the
// latest membership, voters and learners, in id order: when it last heard
// from each, and on the leader their replication progress (Tracked). It
// allocates; call it for observers, not per message.
func (n *Node) PeerProgress() []PeerProgress {
	learners := n.conf.latestLearners()
	members := slices.Concat(n.conf.latest(), learners)
	out := make([]PeerProgress, 0, len(members))
	for _, id := range members {
		if id == n.id {
			continue
		}
		pp := PeerProgress{ID: id, Learner: slices.Contains(learners, id)}
		if t, ok := n.heard[id]; ok {
			pp.Heard, pp.HeardAgoTicks = true, n.now-t
		}
		if n.role == RoleLeader {
			if p := n.lead.peers[id]; p != nil {
				pp.Tracked, pp.Reported = true, p.answered || TestingReportUnanswered
				pp.Commit, pp.Active = p.commit, p.active
				pp.Acked = max(p.commit, n.highestAcked(id))
				pp.LagTicks, pp.LagAtLeast = n.commitLag(p.commit)
			}
		}
		out = append(out, pp)
	}
	slices.SortFunc(out, func(a, b PeerProgress) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// highestAcked is the highest slot the leader still tracks that id
// acknowledged under the leader's ballot (0 when none).
func (n *Node) highestAcked(id NodeID) Slot {
	var hi Slot
	for s, a := range n.lead.acks {
		if s > hi && slices.Contains(a.from, id) {
			hi = s
		}
	}
	return hi
}

// commitLag is how many ticks ago the leader's commit index passed c, from
// the heartbeat history (each heartbeat records the commit index it
// carried and its send tick): the send tick of the oldest remembered
// heartbeat whose commit was already past c. atLeast reports that even the
// oldest remembered heartbeat was past c.
func (n *Node) commitLag(c Slot) (ticks int64, atLeast bool) {
	l := n.lead
	if c >= n.commit {
		return 0, false
	}
	var oldest *hbRecord // oldest remembered heartbeat past c
	older := false       // a remembered heartbeat older than it was not past c
	for i := range l.hbSent {
		r := &l.hbSent[i]
		if r.seq == 0 || r.seq+hbHistoryMax <= l.hbSeq {
			continue // never written, or overwritten soon (not this slot's)
		}
		if r.commit > c {
			if oldest == nil || r.seq < oldest.seq {
				oldest = r
			}
		}
	}
	if oldest == nil {
		return 0, false // passed since the newest heartbeat
	}
	for i := range l.hbSent {
		r := &l.hbSent[i]
		if r.seq != 0 && r.seq+hbHistoryMax > l.hbSeq && r.seq < oldest.seq && r.commit <= c {
			older = true
			break
		}
	}
	return n.now - oldest.tick, !older
}
