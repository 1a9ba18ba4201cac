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
	m := sn.app.members
	switch cc.Type {
	case paxos.ConfAddNode:
		if !slices.Contains(m, cc.Node) {
			m = append(slices.Clone(m), cc.Node)
			slices.Sort(m)
		}
	case paxos.ConfRemoveNode:
		m = slices.DeleteFunc(slices.Clone(m), func(id paxos.NodeID) bool { return id == cc.Node })
	}
	sn.app.members = m
	s.tracef("node %d: slot %d applies %v: members %v", sn.id, e.Slot, cc, m)
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
)

type confPhase uint8

const (
	confIdle confPhase = iota
	confRemoving
	confRemoved
	confAdding
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
	switch c.phase {
	case confIdle:
		if s.liveness || c.cycles >= confCyclesMax || tick < c.nextAt || len(members) < confMembersMin || !s.r.ppm(s.rate(confChangePerTick)) {
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
			c.nextAt = tick + s.r.between(confGapTicksMin, confGapTicksMax)
			return
		}
		s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfRemoveNode, Node: c.target})
	case confRemoved:
		if s.liveness || tick < c.nextAt {
			return
		}
		c.phase = confAdding
		c.proposedAt = -1
		if c.fresh < freshNodesMax && s.r.chance(1, 2) {
			// A node id never seen before joins with an empty store.
			c.fresh++
			s.result.Counts.FreshNodes++
			c.target = c.nextFresh
			c.nextFresh++
			s.tracef("membership: add fresh node %d", c.target)
			s.start(s.addNode(c.target))
		} else {
			s.tracef("membership: add %d back", c.target)
		}
		s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfAddNode, Node: c.target})
	case confAdding:
		if slices.Contains(members, c.target) {
			s.tracef("membership: %d added, members %v", c.target, members)
			c.phase = confIdle
			c.cycles++
			c.nextAt = tick + s.r.between(confGapTicksMin, confGapTicksMax)
			return
		}
		s.confPropose(tick, paxos.ConfChange{Type: paxos.ConfAddNode, Node: c.target})
	}
}

// confPropose proposes cc at a live leader unless an earlier proposal is
// still young.
func (s *sim) confPropose(tick int64, cc paxos.ConfChange) {
	c := &s.conf
	if c.proposedAt >= 0 && tick-c.proposedAt < confRetryTicks {
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
		c.proposedAt = tick - confRetryTicks + confRefusedRetryIn
		return
	}
	s.tracef("membership: node %d proposed %v", leader.id, cc)
	c.proposedAt = tick
	s.result.FaultCount++
	s.result.Counts.ConfChanges++
}
