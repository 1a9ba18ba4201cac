package paxos

import "slices"

// The leader's own vote.
//
// A leader accepts every value it proposes, but its acceptance, like any
// acceptor's, may only count toward a quorum once it survives a crash.
// Unlike a follower's, it does not have to be durable before anything is
// sent: the Accepts carry the value, not the leader's vote. So the leader's
// own acceptances travel in Ready.OwnAccepted, which the caller persists
// in parallel with sending (Raft thesis, section 10.2.1; etcd raft's
// asynchronous storage writes), and the vote is counted only when the
// caller reports the persist done with OwnAcceptedDurable, the way etcd's
// local append thread answers with a MsgStorageAppendResp. One persist is
// then on a write's critical path (the followers'), not two in a row.
//
// Until that report a node does not deliver a committed slot whose value
// it holds only in memory (etcd's async mode applies only locally stable
// entries too): a committed slot may have been chosen by the followers
// alone, and a node that applied it and crashed before its own copy
// reached the log would restart with an applied slot it holds no value
// for, or an older one (NewNode replays the ConfChanges below Applied from
// the log).

// ownUnstableSlotsMax bounds the leader's own acceptances handed out and
// not yet reported durable: past it the leader assigns no new slot until
// reports come back, so a stalled persist costs bounded memory (the
// proposals wait in the queue, ProposalQueueMax).
const ownUnstableSlotsMax = inflightSlotsMax

// OwnAcceptedDurable reports that this node's own acceptances of the
// slots first..last under ballot b, handed out in Ready.OwnAccepted, are
// durable. On a leader still leading under b, each one counts as its vote
// (an AckEvent from itself; a quorum commits), and committed slots held
// back for it are delivered in the next Ready. A report for another ballot,
// a slot this node no longer holds at b (superseded, compacted) or a
// node that stopped leading only releases what was held back; duplicates
// are ignored. Like Step it is an input; unlike Step it may also come
// between a Ready and its Advance.
//
// Every Ready.OwnAccepted must be reported, or the slots it holds are
// never delivered on this node and the leader never counts its vote for
// them. A report must follow the write: reporting early is exactly the
// bug paxossim's planted TestingVoteBeforePersist shows its oracles catch.
func (n *Node) OwnAcceptedDurable(b Ballot, first, last Slot) {
	if first == 0 || last < first || len(n.unstable) == 0 {
		return
	}
	// The slots still held back at b within the range, in slot order (so
	// the AckEvents come out the same on every run): walk the range or the
	// table, whichever is shorter, so that a bogus range costs nothing.
	var slots []Slot
	if last-first >= Slot(len(n.unstable)) {
		for s, ub := range n.unstable {
			if ub == b && s >= first && s <= last {
				slots = append(slots, s)
			}
		}
		slices.Sort(slots)
	} else {
		for s := first; s <= last; s++ {
			if ub, ok := n.unstable[s]; ok && ub == b {
				slots = append(slots, s)
			}
		}
	}
	for _, s := range slots {
		delete(n.unstable, s)
		if n.role != RoleLeader || n.lead.ballot != b {
			continue // no longer leading at b: the report only releases
		}
		e := n.log.get(s)
		a := n.lead.acks[s]
		if e == nil || e.Ballot != b || a == nil || !slices.Contains(n.conf.at(s), n.id) || slices.Contains(a.from, n.id) {
			continue
		}
		n.countAck(s, a, n.id)
	}
}

// holdOwn records the leader's own acceptance of e (already in the log) as
// not yet durable, to hand out in Ready.OwnAccepted.
func (n *Node) holdOwn(e Entry) {
	if n.unstable == nil {
		n.unstable = map[Slot]Ballot{}
	}
	n.unstable[e.Slot] = e.Ballot
	n.ownAccepted = append(n.ownAccepted, e)
}

// demoteOwn runs when the node stops leading: its own acceptances not yet
// handed out become ordinary ones (Ready.Accepted, durable before the next
// messages), so that Ready.OwnAccepted always holds one leadership's
// entries (one ballot, contiguous slots). Those already handed out stay
// held back until reported.
func (n *Node) demoteOwn() {
	for _, e := range n.ownAccepted {
		if n.unstable[e.Slot] == e.Ballot {
			delete(n.unstable, e.Slot)
		}
	}
	n.accepted = append(n.accepted, n.ownAccepted...)
	n.ownAccepted = nil
}

// deliverable is the highest committed slot Ready may deliver: below the
// first committed slot whose value this node holds only as an own
// acceptance not yet reported durable. An entry that was superseded in the
// log (a later leader's value, accepted the ordinary way) or compacted is
// not held back.
func (n *Node) deliverable() Slot {
	if len(n.unstable) == 0 {
		return n.commit
	}
	for s := n.delivered + 1; s <= n.commit; s++ {
		b, ok := n.unstable[s]
		if !ok {
			continue
		}
		if e := n.log.get(s); e != nil && e.Ballot == b {
			return s - 1
		}
		delete(n.unstable, s) // superseded: its report will find nothing
	}
	return n.commit
}

// ownUnstableFull reports whether the leader must wait for reports before
// it assigns another slot.
func (n *Node) ownUnstableFull() bool { return len(n.unstable) >= ownUnstableSlotsMax }
