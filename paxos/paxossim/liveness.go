package paxossim

import (
	"fmt"
	"slices"
	"strings"

	"synod/paxos"
)

// heal ends the fault phase: the network becomes reliable (delays remain),
// every crashed node restarts.
func (s *sim) heal() {
	s.tracef("liveness phase: heal everything")
	s.liveness = true
	s.net.heal()
	s.net.dropPPM, s.net.dupPPM, s.net.longDelayPPM = 0, 0, 0
	for _, sn := range s.nodes {
		sn.crashMidReady, sn.crashAfterSend = false, false
		if !sn.up() {
			s.start(sn)
		}
	}
}

// settled reports whether the liveness phase is done: no client operation
// pending and every member has applied everything any node committed.
func (s *sim) settled() bool {
	for _, c := range s.clients {
		if c.op != nil {
			return false
		}
	}
	var top paxos.Slot
	for _, sn := range s.nodes {
		if st := sn.n.Status(); st.Commit > top {
			top = st.Commit
		}
	}
	for _, sn := range s.nodes {
		if (s.isMember(sn.id) || slices.Contains(s.currentLearners(), sn.id)) && sn.app.applied < top {
			return false // learners catch up too (a joiner by snapshot)
		}
	}
	return true
}

func (s *sim) isMember(id paxos.NodeID) bool { return slices.Contains(s.currentMembers(), id) }

// currentMembers is the membership after the highest slot any replica
// applied. Replicas agree slot by slot (the checker verifies it), so this
// never goes back when the most advanced replica crashes.
func (s *sim) currentMembers() []paxos.NodeID {
	if s.membersSlot == 0 {
		return s.genesis
	}
	return s.members
}

// currentLearners is the learners after the highest slot any replica
// applied.
func (s *sim) currentLearners() []paxos.NodeID { return s.learners }

// noteMembers records the membership a replica holds after slot.
func (s *sim) noteMembers(slot paxos.Slot, members, learners []paxos.NodeID) {
	s.chk.q().governs(s.chk, slot+1, members) // check_quorum.go
	if slot > s.membersSlot {
		s.membersSlot = slot
		s.members = members
		s.learners = learners
	}
}

func (s *sim) livenessFailure() {
	var pending []string
	for _, c := range s.clients {
		if c.op != nil {
			pending = append(pending, fmt.Sprintf("client %d: %s (target %d)", c.id, kvModel.DescribeOperation(c.op.in, kvOutput{}), c.op.target))
		}
	}
	var nodes []string
	for _, sn := range s.nodes {
		st := sn.n.Status()
		nodes = append(nodes, fmt.Sprintf("n%d %s leader=%d promised=%d.%d commit=%d applied=%d first=%d last=%d members=%v",
			sn.id, st.Role, st.Leader, st.Promised.Round, st.Promised.Node, st.Commit, sn.app.applied, st.FirstSlot, st.LastSlot, st.Members))
	}
	s.chk.violate("liveness: not settled %d ticks after faults healed (membership %v): pending [%s]; nodes [%s]",
		LivenessTicksMax, s.currentMembers(), strings.Join(pending, "; "), strings.Join(nodes, "; "))
}
