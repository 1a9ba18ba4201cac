package paxos

import (
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Leadership transfer: so that an operator can restart the leader without
// an election timeout of unavailability.
//
// A plain step-down would not do: every acceptor that acked the leader's
// heartbeats refuses every other ballot until its lease runs out (the
// lease rule in doc.go), and the others hold off the pre-check while they
// hear from a leader. The hand-over therefore:
//
//  1. TransferLeadership(to) on the leader: it assigns no new slot and
//     takes no proposal or change (ErrTransferring), and broadcasts a
//     heartbeat at once;
//  2. once nothing is in flight (commit == last slot) and the target has
//     reported that commit index, the leader steps down: from then on it
//     answers no read from its lease and proposes nothing under its ballot.
//     Only then does it drop its own acceptor's grant and send MsgTransfer
//     (under its ballot, Context = the target) to every voter;
//  3. a receiver that granted its lease to the sender under that ballot
//     (the ballot it still promises) releases it: the lease protected the
//     sender's lease reads, and the sender has stopped serving them. The
//     target then campaigns at once, skipping the pre-check (its peers
//     still hear from a leader), and resends its Prepares every heartbeat
//     period to the voters that have not promised (a Prepare can overtake
//     the release and be refused).
//
// Why leases stay safe: a lease is valid only on a node that leads, and
// the old leader stops leading before any acceptor releases it (the
// MsgTransfer messages are sent by the stepped-down node). A release names
// the ballot: a delayed MsgTransfer of an earlier term never releases a
// lease granted to a later one (a node leads each ballot at most once).
// The lease oracle of paxossim checks this under faults, and its planted
// twin (TestingTransferKeepsLease: release without stepping down) shows
// the oracle catches the difference.
//
// If the target does not catch up within ElectionTicks the attempt ends and
// the leader goes on leading. If the MsgTransfer to the target is lost, the
// stepped-down leader resends it every heartbeat period until it hears of a
// leader or ElectionTicks pass; past that an ordinary election follows.

// A hand-over at once (TransferLeadershipNow) skips step 2's wait: the
// leader steps down and sends MsgTransfer right away, whatever is in
// flight and however far behind the target is. It is for a leader that
// cannot finish what it has in flight (kv/replica stuck.go): one whose own
// vote waits for room in a full acceptor log, with a follower that cannot
// take its accepts either, never reaches commit == last slot, so the
// ordinary hand-over could never complete (e2e TestFullLogStaysLive, CI:
// no write for 60 s while the one node that knew the slots chosen was
// never elected). It is as safe as the leader's crash, which any election
// survives: the target's phase 1 finds every value that may have been
// chosen in a quorum's promises, and the slots in flight are re-proposed
// or filled by it. Leases are released exactly as above (the sender has
// stepped down first), so the lease argument is unchanged. What is lost
// is only the wait: proposals in flight on the old leader end as on any
// lost leadership.

// ErrTransferTarget reports a transfer to a node that is not a voter of the
// latest membership.
var ErrTransferTarget = errors.New("paxos: the transfer target is not a voter")

// transferState is the hand-over bookkeeping of one node.
type transferState struct {
	// As leader: the voter leadership goes to (0: none), under which of
	// this node's ballots, and the tick the attempt gives up at.
	to     NodeID
	ballot Ballot
	until  int64
	// As the leader that stepped down: the target and ballot its
	// MsgTransfer named, resent every heartbeat period while no leader is
	// known and this node still promises sentBallot, until resendUntil.
	sentTo      NodeID
	sentBallot  Ballot
	resendUntil int64
	// As the target: the ballot of the campaign a MsgTransfer started.
	campaign Ballot
	// elapsed counts ticks toward the next resend (either kind).
	elapsed int
}

// TransferLeadership hands leadership to voter to (see above). It returns
// nil once the hand-over has started (the caller watches Status().Leader to
// learn that it finished), nil at once when to is this node, ErrNotLeader
// on a non-leader, ErrTransferTarget when to is not a voter,
// ErrConfChangeBusy while a membership change is queued or uncommitted,
// and ErrTransferring while another hand-over runs.
func (n *Node) TransferLeadership(to NodeID) error {
	if err := n.transferAllowed(to, false); err != nil || to == n.id {
		return err
	}
	if n.transferring() {
		return ErrTransferring
	}
	n.xfer = transferState{to: to, ballot: n.lead.ballot, until: n.now + int64(n.cfg.ElectionTicks)}
	n.broadcastHeartbeat() // the target reports its commit index sooner
	return nil
}

// TransferLeadershipNow hands leadership to voter to at once, without
// waiting for the slots in flight to commit or for the target to catch up
// (see "A hand-over at once" above): on return this node no longer leads.
// It replaces an ordinary hand-over still waiting. Its errors are
// TransferLeadership's, less ErrTransferring and ErrConfChangeBusy: a
// membership change in flight is one more slot in flight, which the
// target's phase 1 recovers as after a crash (a voter it adds that
// granted a lease but is not yet in the membership MsgTransfer goes to
// releases it only when the lease runs out: an election timeout later,
// never earlier).
func (n *Node) TransferLeadershipNow(to NodeID) error {
	if err := n.transferAllowed(to, true); err != nil || to == n.id {
		return err
	}
	n.xfer = transferState{to: to, ballot: n.lead.ballot, until: n.now + int64(n.cfg.ElectionTicks)}
	n.handOver()
	return nil
}

// transferAllowed checks what both hand-overs need: this node leads and to
// is a voter of the latest membership (or this node); and, unless now, no
// membership change is queued or uncommitted (the ordinary hand-over waits
// for everything in flight, and a change can hold its commit index back
// for long).
func (n *Node) transferAllowed(to NodeID, now bool) error {
	switch {
	case n.role != RoleLeader:
		return ErrNotLeader
	case to == n.id:
		return nil
	case !slices.Contains(n.conf.latest(), to):
		return fmt.Errorf("%w: node %d (voters %v)", ErrTransferTarget, to, n.conf.latest())
	case !now && n.lead.confChangeInFlight():
		return ErrConfChangeBusy
	}
	return nil
}

// transferring reports whether this node leads and is handing over.
func (n *Node) transferring() bool {
	return n.role == RoleLeader && n.xfer.to != 0 && n.xfer.ballot == n.lead.ballot
}

// checkTransfer hands over once the target holds everything this leader
// committed and nothing is in flight (from flush, after every input).
func (n *Node) checkTransfer() {
	if !n.transferring() {
		return
	}
	x := &n.xfer
	p := n.lead.peers[x.to]
	if n.now >= x.until || p == nil || !slices.Contains(n.conf.latest(), x.to) {
		x.to = 0 // gave up (or the target left): go on leading
		return
	}
	if n.commit == n.log.last() && p.commit >= n.commit {
		n.handOver()
	}
}

// handOver steps down and sends MsgTransfer to every voter.
func (n *Node) handOver() {
	b, to := n.lead.ballot, n.xfer.to
	voters := slices.Clone(n.conf.latest())
	if TestingTransferKeepsLease {
		// Planted: release the acceptors' leases but keep leading (and
		// serving reads from the lease).
		n.xfer.to = 0
	} else {
		n.becomeFollower()
		if n.leaseHolder == n.id {
			n.leaseUntil = n.now // the grant this node made itself as leader
		}
		n.xfer = transferState{sentTo: to, sentBallot: b, resendUntil: n.now + int64(n.cfg.ElectionTicks)}
	}
	for _, id := range voters {
		if id != n.id {
			n.send(Message{Type: MsgTransfer, To: id, Ballot: b, Context: uint64(to)})
		}
	}
}

func (n *Node) handleTransfer(m *Message) {
	if m.Ballot != n.promised {
		return // from a term this node has moved past (or not reached)
	}
	if n.leaseHolder == m.From && n.now < n.leaseUntil {
		n.leaseUntil = n.now // released: its holder stopped leading
	}
	if NodeID(m.Context) != n.id || n.role != RoleFollower || !n.isVoter() || n.leaseBlocks(n.id) {
		return
	}
	n.campaign()
	if n.role == RoleCandidate {
		n.xfer.campaign, n.xfer.elapsed = n.cand.ballot, 0
	}
}

// tickTransfer runs the hand-over's timers: the leader gives up at its
// deadline, the stepped-down leader resends MsgTransfer, the target's
// campaign resends its Prepares.
func (n *Node) tickTransfer(k int) {
	x := &n.xfer
	switch n.role {
	case RoleLeader:
		if n.transferring() && n.now >= x.until {
			x.to = 0
		}
	case RoleCandidate:
		if x.campaign.IsZero() || n.cand.ballot != x.campaign {
			return
		}
		if x.elapsed += k; x.elapsed < n.cfg.HeartbeatTicks {
			return
		}
		x.elapsed = 0
		c := n.cand
		for _, id := range slices.Sorted(maps.Keys(c.sent)) {
			if id == n.id || c.done[id] {
				continue
			}
			from := c.from
			if t, ok := c.through[id]; ok {
				from = t + 1
			}
			n.send(Message{Type: MsgPrepare, To: id, Ballot: c.ballot, Slot: from, Commit: n.commit})
		}
	case RoleFollower:
		if x.sentTo == 0 {
			return
		}
		if n.leader != 0 || n.now >= x.resendUntil || n.promised != x.sentBallot {
			x.sentTo = 0
			return
		}
		if x.elapsed += k; x.elapsed < n.cfg.HeartbeatTicks {
			return
		}
		x.elapsed = 0
		for _, id := range n.conf.latest() {
			if id != n.id {
				n.send(Message{Type: MsgTransfer, To: id, Ballot: x.sentBallot, Context: uint64(x.sentTo)})
			}
		}
	}
}
