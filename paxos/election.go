package paxos

// resetElectionTimer restarts the election countdown with a fresh
// randomized timeout in [ElectionTicks, 2*ElectionTicks).
func (n *Node) resetElectionTimer() {
	n.electionElapsed = 0
	n.electionTimeout = n.cfg.ElectionTicks + n.rng.IntN(n.cfg.ElectionTicks)
}

// becomeFollower drops any leadership or candidacy.
func (n *Node) becomeFollower() {
	n.demoteOwn()
	n.role = RoleFollower
	n.lead = nil
	n.cand = nil
	n.leader = 0
	n.prechecking = false
	n.resetElectionTimer()
}

func (n *Node) tickElection(k int) {
	if n.cfg.ExternalElection {
		return
	}
	n.electionElapsed += k
	if n.electionElapsed >= n.electionTimeout {
		n.resetElectionTimer()
		n.startPreCheck()
	}
}

// startPreCheck asks the members whether they have heard from a leader
// lately. Only when a majority says no does this node run phase 1, so a node
// that was cut off (and whose timer fired) cannot depose a leader the rest
// still hear from. A member also says yes only to a node that has committed
// at least as far as itself (handlePreCheck), so the node that campaigns is
// one with the least to learn in phase 1.
func (n *Node) startPreCheck() {
	if !n.isVoter() || n.leaseBlocks(n.id) || !n.roomToLead() {
		return
	}
	n.precheckRound++
	n.prechecking = true
	n.precheckGrants = map[NodeID]bool{n.id: true}
	if n.precheckWon() {
		n.campaign()
		return
	}
	for _, id := range n.conf.latest() {
		if id != n.id {
			n.send(Message{Type: MsgPreCheck, To: id, Context: n.precheckRound, Commit: n.commit})
		}
	}
}

func (n *Node) precheckWon() bool {
	members := n.conf.latest()
	c := 0
	for _, id := range members {
		if n.precheckGrants[id] {
			c++
		}
	}
	return c >= quorum(len(members))
}

// handlePreCheck grants a pre-check when this node has not heard from a
// leader within ElectionTicks, holds no lease for another node, and the
// asking node has committed at least as far as this one (m.Commit >=
// commit). The last is Raft's up-to-date rule moved to the pre-check, for
// liveness only: a lagging node's phase 1 must collect every slot it has
// not committed, chunk by chunk, which under load outlasts its election
// timeout, and each new campaign restarted it under a higher ballot that
// every acceptor promised, so no other node could campaign (an outside
// check: 8 s without a leader while a follower fetching a 314 MB snapshot
// campaigned from round 3 to 29). Among the voters of any live majority
// the one that committed furthest is granted by all the others, so an
// election still ends. A node that is not a voter of its latest membership
// does not refuse a lagging node: it will not campaign itself, and a
// removed leader that committed its own removal and stepped down was the
// only node that knew the last slots committed (paxossim: the two members
// left stood behind it, refused by it, until it compacted). A node whose
// compacted log starts above the asking node's commit refuses, and offers
// it a snapshot.
func (n *Node) handlePreCheck(m *Message) {
	heard := n.role == RoleLeader ||
		(n.leader != 0 && n.now-n.lastLeaderTick < int64(n.cfg.ElectionTicks))
	behind := m.Commit+1 < n.log.first
	lagging := m.Commit < n.commit && n.isVoter() && !TestingPreCheckIgnoresCommit
	grant := !heard && !n.leaseBlocks(m.From) && !behind && !lagging
	n.send(Message{Type: MsgPreCheckResp, To: m.From, Context: m.Context, Commit: n.commit, Reject: !grant})
	if behind {
		n.offerSnapshot(m.From)
	}
}

func (n *Node) handlePreCheckResp(m *Message) {
	if !n.prechecking || m.Context != n.precheckRound || n.role == RoleLeader {
		return
	}
	if m.Reject {
		n.precheckRefusals++ // Status.PreCheckRefusals: why this node does not campaign
		return
	}
	n.precheckGrants[m.From] = true
	if n.precheckWon() {
		n.campaign()
	}
}

// campaign starts phase 1 under a ballot above every one seen.
func (n *Node) campaign() {
	n.prechecking = false
	if n.leaseBlocks(n.id) {
		// A heartbeat arrived during the pre-check: the lease granted to
		// that leader binds this node's own acceptor too.
		return
	}
	if !n.roomToLead() {
		return // its log filled during the pre-check, or a transfer named it
	}
	round := max(n.maxRound, n.promised.Round) + 1
	n.maxRound = round
	b := Ballot{Round: round, Node: n.id}
	n.role = RoleCandidate
	n.lead = nil
	n.leader = 0
	n.promised = b
	n.promisedDirty = true
	n.electionElapsed = 0
	from := n.commit + 1
	c := &candidate{
		ballot:  b,
		from:    from,
		through: map[NodeID]Slot{},
		done:    map[NodeID]bool{},
		sent:    map[NodeID]bool{n.id: true},
		values:  map[Slot]adopted{},
		maxSlot: from - 1,
	}
	n.cand = c
	// This node's own acceptor state is one promise.
	for s := from; s <= n.log.last(); s++ {
		if e := n.log.get(s); e != nil {
			c.add(n, e, false)
		}
	}
	c.done[n.id] = true
	n.checkPhase1()
}
