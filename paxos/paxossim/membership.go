package paxossim

import (
	"slices"

	"synod/paxos"
)

// applyConfChange applies a committed membership change to the
// application's view of the membership (the view snapshots carry).
func (s *sim) applyConfChange(sn *simNode, e *paxos.Entry) {
	if len(e.Cmds) != 1 {
		s.chk.violate("node %d: slot %d conf change carries %d commands", sn.id, e.Slot, len(e.Cmds))
		return
	}
	cc, err := paxos.DecodeConfChange(e.Cmds[0])
	if err != nil {
		s.chk.violate("node %d: slot %d conf change does not decode: %v", sn.id, e.Slot, err)
		return
	}
	// The rules, restated independently of the core's: a change that
	// does not apply changes nothing.
	m, l := sn.app.members, sn.app.learners
	voter, learner := slices.Contains(m, cc.Node), slices.Contains(l, cc.Node)
	drop := func(ids []paxos.NodeID) []paxos.NodeID {
		return slices.DeleteFunc(slices.Clone(ids), func(id paxos.NodeID) bool { return id == cc.Node })
	}
	add := func(ids []paxos.NodeID) []paxos.NodeID {
		out := append(slices.Clone(ids), cc.Node)
		slices.Sort(out)
		return out
	}
	switch {
	case cc.Type == paxos.ConfAddNode && !voter && !learner:
		m = add(m)
	case cc.Type == paxos.ConfAddLearner && !voter && !learner:
		l = add(l)
	case cc.Type == paxos.ConfPromote && learner:
		m, l = add(m), drop(l)
	case cc.Type == paxos.ConfRemoveNode && learner:
		l = drop(l)
	case cc.Type == paxos.ConfRemoveNode && voter && len(m) > 1:
		m = drop(m)
	}
	sn.app.members, sn.app.learners = m, l
	s.tracef("node %d: slot %d applies %v: members %v learners %v", sn.id, e.Slot, cc, m, l)
}

// Membership-change schedule limits, in ticks and changes.
const (
	confCyclesMax      = 2  // remove-then-add cycles per run
	confRetryTicks     = 20 // re-propose a change not applied after this long
	confGapTicksMin    = 10
	confGapTicksMax    = 60
	confMembersMin     = 3 // never remove below this many members
	freshNodesMax      = 1 // fresh node ids added per run
	confRefusedRetryIn = 3
	// The membership-heavy profile (Options.MembershipHeavy): many quick
	// remove/add cycles, under partitions, crashes and lost messages.
	heavyConfCyclesMax   = 12
	heavyConfGapTicksMax = 8
	heavyConfPerTick     = 300_000
	heavyFreshNodesMax   = 3
	heavyConfRetryTicks  = 6
	// heavyConfMembersMin keeps at least three members after a removal.
	// Known liveness limit (not safety): when a leader removes itself and
	// leaves two members that both lag behind its commit index (neither
	// has applied the changes that made it a member, so neither thinks it
	// is one), nobody campaigns; the heavy profile hit that in about one
	// seed in 250 when it allowed two-member groups.
	heavyConfMembersMin = 4
)

// confLimits are the membership schedule's bounds of this run.
func (s *sim) confLimits() (cycles int, gapMin, gapMax int64, perTick uint32, fresh int, retry int64) {
	if s.opts.MembershipHeavy {
		return heavyConfCyclesMax, 1, heavyConfGapTicksMax, heavyConfPerTick, heavyFreshNodesMax, heavyConfRetryTicks
	}
	return confCyclesMax, confGapTicksMin, confGapTicksMax, confChangePerTick, freshNodesMax, confRetryTicks
}

type confPhase uint8

const (
	confIdle confPhase = iota
	confRemoving
	confRemoved
	confAdding
	// The learner path of the membership-heavy profile: add as a
	// learner, wait (or remove the learner again), promote.
	confAddingLearner
	confLearner
	confPromoting
	confRemovingLearner
)

// Learner schedule of the membership-heavy profile.
const (
	// heavyLearnerOdds: one re-add in this many goes through the legacy
	// ConfAddNode; the others add a learner and promote it.
	heavyLegacyAddOdds = 4
	// heavyJoinOdds: one fresh node in this many starts in Join mode (no
	// membership until it installs a snapshot); the others start with the
	// genesis membership and replay the log.
	heavyJoinOdds = 2
	// heavyDropLearnerOdds: one learner in this many is removed again
	// before its promotion.
	heavyDropLearnerOdds = 4
)

// confChanger drives the membership fault: remove a member, wait, add it
// back (or add a fresh node id instead), through the current leader,
// retrying until the change is applied.
type confChanger struct {
	phase      confPhase
	target     paxos.NodeID
	proposedAt int64 // tick; -1 when not yet proposed
	nextAt     int64 // tick before which the next phase does not start
	cycles     int
	fresh      int
	nextFresh  paxos.NodeID
}

func (s *sim) confStep(tick int64) {
	c := &s.conf
	members := s.currentMembers()
	cyclesMax, gapMin, gapMax, perTick, freshMax, _ := s.confLimits()
	switch c.phase {
	case confIdle:
		minMembers := confMembersMin
		if s.opts.MembershipHeavy {
			minMembers = heavyConfMembersMin
		}
		if s.liveness || c.cycles >= cyclesMax || tick < c.nextAt || len(members) < minMembers || !s.r.ppm(s.rate(perTick)) {
			return
		}
		c.phase = confRemoving
		c.target = members[s.r.intn(len(members))]
		c.proposedAt = -1
		s.tracef("membership: remove %d from %v", c.target, members)
		s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfRemoveNode, Node: c.target})
	case confRemoving:
		if !slices.Contains(members, c.target) {
			s.tracef("membership: %d removed, members %v", c.target, members)
			c.phase = confRemoved
			c.nextAt = tick + s.r.between(gapMin, gapMax)
			return
		}
		s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfRemoveNode, Node: c.target})
	case confRemoved:
		if s.liveness || tick < c.nextAt {
			return
		}
		c.phase = confAdding
		c.proposedAt = -1
		if c.fresh < freshMax && s.r.chance(1, 2) {
			// A node id never seen before joins with an empty store.
			c.fresh++
			s.result.Counts.FreshNodes++
			c.target = c.nextFresh
			c.nextFresh++
			s.tracef("membership: add fresh node %d", c.target)
			// The operator's step: every running node's address book
			// learns the new node (a restarted one gets it in Config).
			for _, sn := range s.nodes {
				if sn.up() {
					sn.n.AddKnown(c.target)
				}
			}
			fresh := s.addNode(c.target)
			if s.opts.MembershipHeavy && s.r.chance(1, heavyJoinOdds) {
				fresh.join = true
				s.result.Counts.Joins++
			}
			s.start(fresh)
		} else {
			s.tracef("membership: add %d back", c.target)
		}
		if s.opts.MembershipHeavy && (s.byID[c.target].join || !s.r.chance(1, heavyLegacyAddOdds)) {
			c.phase = confAddingLearner
			s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfAddLearner, Node: c.target})
			return
		}
		s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfAddNode, Node: c.target})
	case confAddingLearner:
		if slices.Contains(s.currentLearners(), c.target) {
			s.tracef("membership: %d added as a learner", c.target)
			s.result.Counts.Learners++
			c.phase = confLearner
			c.nextAt = tick + s.r.between(gapMin, gapMax)
			return
		}
		s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfAddLearner, Node: c.target})
	case confLearner:
		if tick < c.nextAt {
			return
		}
		c.proposedAt = -1
		if !s.liveness && s.r.chance(1, heavyDropLearnerOdds) {
			c.phase = confRemovingLearner
			s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfRemoveNode, Node: c.target})
			return
		}
		c.phase = confPromoting
		s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfPromote, Node: c.target})
	case confPromoting:
		if slices.Contains(members, c.target) {
			s.tracef("membership: learner %d promoted, members %v", c.target, members)
			s.result.Counts.Promotions++
			c.phase = confIdle
			c.cycles++
			c.nextAt = tick + s.r.between(gapMin, gapMax)
			return
		}
		s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfPromote, Node: c.target})
	case confRemovingLearner:
		if !slices.Contains(s.currentLearners(), c.target) {
			s.tracef("membership: learner %d removed before its promotion", c.target)
			c.phase = confRemoved // it is added again (or a fresh node is)
			c.nextAt = tick + s.r.between(gapMin, gapMax)
			return
		}
		s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfRemoveNode, Node: c.target})
	case confAdding:
		if slices.Contains(members, c.target) {
			s.tracef("membership: %d added, members %v", c.target, members)
			c.phase = confIdle
			c.cycles++
			c.nextAt = tick + s.r.between(gapMin, gapMax)
			return
		}
		s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfAddNode, Node: c.target})
	}
}

// confPropose proposes cc at a live leader unless an earlier proposal is
// still young.
func (s *sim) confPropose(tick int64, cc paxos.ConfChange) {
	c := &s.conf
	_, _, _, _, _, retry := s.confLimits()
	if c.proposedAt >= 0 && tick-c.proposedAt < retry {
		return
	}
	var leader *simNode
	for _, sn := range s.nodes {
		if sn.up() && sn.n.Status().Role == paxos.RoleLeader {
			leader = sn // the last (highest id) leader found; any will do
		}
	}
	if leader == nil {
		return
	}
	err := leader.n.ProposeConfChange(cc)
	s.process(leader)
	if err != nil {
		s.tracef("membership: node %d refused %v: %v", leader.id, cc, err)
		c.proposedAt = tick - retry + confRefusedRetryIn
		return
	}
	s.tracef("membership: node %d proposed %v", leader.id, cc)
	c.proposedAt = tick
	s.result.FaultCount++
	s.result.Counts.ConfChanges++
}

// The pipeline rule of ProposeConfChange, checked from outside: no leader
// sends an Accept for a slot above a ConfChange it proposed (or re-proposed
// after phase 1) that its commit index has not reached. Memberships are
// only safe to switch at a committed change: an Accept above an
// uncommitted one is counted under a membership that may never be chosen.

// noteLeaderConfChanges records the ConfChange entries sn accepted under
// its own ballot (as leader) in this Ready.
func (s *sim) noteLeaderConfChanges(sn *simNode, rd *paxos.Ready) {
	for _, e := range slices.Concat(rd.Accepted, rd.OwnAccepted) {
		if e.Type == paxos.EntryConfChange && e.Ballot.Node == sn.id {
			sn.leaderCC = append(sn.leaderCC, slotBallot{e.Slot, e.Ballot})
		}
	}
}

// checkAcceptPastConfChange checks one message sn is about to send.
func (s *sim) checkAcceptPastConfChange(sn *simNode, m *paxos.Message) {
	if m.Type != paxos.MsgAccept || m.Reject || len(sn.leaderCC) == 0 || len(m.Entries) == 0 {
		return
	}
	commit := sn.n.Status().Commit
	// Changes at or below the commit index are decided; those proposed
	// under an older ballot of this node were re-proposed (and recorded
	// again) by phase 1 if they still matter.
	sn.leaderCC = slices.DeleteFunc(sn.leaderCC, func(c slotBallot) bool { return c.slot <= commit || c.ballot.Less(m.Ballot) })
	top := m.Entries[len(m.Entries)-1].Slot
	for _, c := range sn.leaderCC {
		if c.ballot == m.Ballot && top > c.slot {
			s.chk.violateSafety("node %d sent an Accept for slot %d above its uncommitted ConfChange at slot %d (commit %d)", sn.id, top, c.slot, commit)
			return
		}
	}
}
