package paxos

// A catch-up that makes no progress ends in a snapshot offer.
//
// A lagging acceptor is sent the chosen entries it misses (sendCatchup),
// and a snapshot only once the leader compacted past them. An acceptor
// may take none of those entries for as long as it lacks the room to
// store them: one restarted with a log full of records it does not know
// committed, under a leader of another ballot, whose application drops
// catch-ups that do not fit (kv/replica accept_admission.go). While
// writes flow the leader compacts past it soon enough; in an idle cluster
// it never would, and the acceptor would stay behind, its log full, for
// ever. So when a lagging peer's commit index has not moved through
// catchupStuckSendsMin catch-ups and catchupStuckTicks, the leader offers
// it the state it has applied (the application serves its current state,
// stamped with SnapshotMetaAt, as for offerableSnapshot before any
// compaction), at most once per election timeout. Offering a snapshot is
// always safe: it holds only chosen values.

// A peer that was silent (down, paused, cut off) for longer than an
// election timeout is not stuck either: its commit index stood still
// because it was away, and the catch-ups sent before it left say nothing
// of how it takes them now. Its count starts afresh when it is heard
// again (heardFrom); without that, a follower restarted after an outage
// with its commit index where it stopped, having been sent a catch-up
// just before it left, could be offered a whole snapshot a few catch-ups
// after its return, while the leader's log still held every slot it
// missed (TestStuckCountRestartsAfterSilence). The catch-ups themselves
// must reach it too: kv/replica's side channel dials a returned peer as
// soon as it is heard (sideChannel.heard).

// catchupStuckSendsMin is how many catch-ups a peer must have been sent
// without its commit index moving before it counts as stuck: a peer that
// was down, or answers late, is not.
const catchupStuckSendsMin = 8

// catchupStuckTicks is how long a lagging peer's commit index may stand
// still under catch-ups before the leader offers it a snapshot: four
// election timeouts.
func (n *Node) catchupStuckTicks() int64 { return 4 * int64(n.cfg.ElectionTicks) }

// catchupStuck counts a catch-up about to go to peer and sends it a
// snapshot offer instead when its catch-up has stood still (leader); it
// reports whether entries should not be sent.
func (n *Node) catchupStuck(to NodeID, p *peer) bool {
	if p.stuckSends == 0 {
		p.stuckSince = n.now
	}
	p.stuckSends++
	if TestingNoStuckCatchupOffer || p.stuckSends <= catchupStuckSendsMin ||
		n.now-p.stuckSince < n.catchupStuckTicks() || n.applied <= p.commit {
		return false
	}
	if p.lastSnapTick != 0 && n.now-p.lastSnapTick < int64(n.cfg.ElectionTicks) {
		return true // offered lately; entries would be dropped again
	}
	p.lastSnapTick = n.now
	meta := n.metaAt(n.applied)
	n.send(Message{Type: MsgSnapshot, To: to, Ballot: n.lead.ballot, Commit: n.commit, Snapshot: &meta})
	return true
}

// heardFrom notes an answer from peer p (leader): it is active in this
// check-quorum window, and if it had been silent for more than an election
// timeout, its stuck count starts afresh.
func (n *Node) heardFrom(p *peer) {
	p.active, p.answered = true, true
	if p.heardTick != 0 && n.now-p.heardTick > int64(n.cfg.ElectionTicks) && !TestingStuckAcrossSilence {
		p.stuckSince, p.stuckSends = 0, 0
	}
	p.heardTick = n.now
}
