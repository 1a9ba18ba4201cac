package paxos

import (
	"fmt"
	"slices"
)

// Joining a running group (kvnode --join).
//
// A new node cannot replay the log from slot 1 by itself: it does not know
// the membership the group started with, and the membership in force at a
// slot decides who counts there. So a node started with Config.Join knows
// no membership at all until it installs a snapshot, whose metadata carries
// the membership in force after it (voters and learners):
//
//   - it stores no accepted entry and commits nothing (handleAccept and
//     handleCatchup skip the entries), so it never answers a Prepare with
//     a value and its commit index stays 0;
//   - it answers heartbeats, marked Joining (flagJoining on the wire), and
//     it is no voter, so it never campaigns;
//   - the leader sends a node whose heartbeat answer says Joining its
//     snapshot offer instead of entries (joinerNeedsSnapshot), and, having
//     no snapshot yet, offers the state it has applied (offerableSnapshot);
//   - InstallSnapshot ends the joining state; from there on the node is an
//     ordinary member that catches up by entries.
//
// The operator adds the node as a learner (ConfAddLearner) once it runs,
// and promotes it (ConfPromote) once it has caught up; the leader refuses a
// promotion while the learner lags (ErrLearnerBehind).

// joinerNeedsSnapshot reports whether the leader should offer peer to its
// snapshot rather than entries: its last heartbeat answer said it joins.
func (n *Node) joinerNeedsSnapshot(to NodeID, p *peer) bool {
	return p.commit == 0 && n.joiners[to]
}

// noteJoining records whether the sender of a heartbeat answer is joining
// (at most one entry per known node: the senders Step admits).
func (n *Node) noteJoining(m *Message) {
	switch {
	case m.Joining:
		if n.joiners == nil {
			n.joiners = map[NodeID]bool{}
		}
		n.joiners[m.From] = true
	case n.joiners != nil:
		delete(n.joiners, m.From)
	}
}

// offerableSnapshot is what this node can offer a laggard: its latest
// snapshot, or when it has compacted nothing yet, the state it has applied
// (the application serves its current state, stamped with SnapshotMetaAt).
// nil when it has applied nothing.
func (n *Node) offerableSnapshot() *SnapshotMeta {
	if n.snap != nil {
		return n.snap
	}
	if n.applied == 0 {
		return nil
	}
	m := n.metaAt(n.applied)
	return &m
}

// Joining reports whether the node was started with Config.Join and has
// not installed a snapshot yet.
func (n *Node) Joining() bool { return n.joining }

// cloneSnapshotMeta is a deep copy of m.
func cloneSnapshotMeta(m SnapshotMeta) SnapshotMeta {
	return SnapshotMeta{Slot: m.Slot, Members: slices.Clone(m.Members), Learners: slices.Clone(m.Learners)}
}

// validLearners checks a snapshot's learners: at most MembersMax members
// in all, no node 0, none twice, none a voter too.
func validLearners(s *SnapshotMeta) error {
	if len(s.Members)+len(s.Learners) > MembersMax {
		return fmt.Errorf("%w: snapshot with %d voters and %d learners", ErrBadMessage, len(s.Members), len(s.Learners))
	}
	for i, id := range s.Learners {
		if id == 0 || slices.Contains(s.Members, id) || slices.Contains(s.Learners[:i], id) {
			return fmt.Errorf("%w: snapshot learner %d is 0, a voter or repeated", ErrBadMessage, id)
		}
	}
	return nil
}
