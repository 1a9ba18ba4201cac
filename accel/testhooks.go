package accel

import "synod/paxos"

// TestingCountRemovedMembers is test only: when true the quorum aggregator
// keeps counting a member-table entry after software removed its member.
// It plants the mistake of an aggregator that keeps its own copy of the
// member table (beside the slot table, off the CAM's critical path) and
// updates that copy only on writes of a non-zero NodeID, as if a write of
// 0 were no write: after SetMember(i, 0) the aggregator still matches the
// removed node at entry i (its Accepted sets bit i instead of being handed
// up as ReasonMember) and still counts bit i towards the quorum (acks the
// removed node sent before its removal stay counted). Writing a non-zero
// NodeID to entry i ends the effect for that entry. The lease engine and
// the follower side are not affected. Tests set it, before building any
// plane and with no plane in use, to show that the scripts
// (TestScriptsPlantedRemovedMember) and the simulator check
// (TestSimulatorWithAccelPlantedRemovedMember) catch the bug; production
// code never sets it.
var TestingCountRemovedMembers bool

// noteMemberWrite keeps the planted bug's view of the member table: the
// NodeID entry i held before software cleared it. It must run before the
// member table is written. Without the hook it does nothing.
func (s *state) noteMemberWrite(i uint16, node paxos.NodeID) {
	if !TestingCountRemovedMembers {
		return
	}
	if node == 0 && s.members[i] != 0 {
		s.removed[i] = s.members[i]
	} else if node != 0 {
		s.removed[i] = 0
	}
}

// aggMemberIndex is memberIndex as the quorum aggregator sees it: the same
// lookup, plus (planted bug only) the entries whose member was removed.
func (s *state) aggMemberIndex(from paxos.NodeID) (uint16, bool) {
	idx, ok := s.memberIndex(from)
	if ok || !TestingCountRemovedMembers || from == 0 {
		return idx, ok
	}
	for i := 0; i < s.spec.Replicas; i++ {
		if s.removed[i] == from {
			return uint16(i), true
		}
	}
	return 0, false
}

// aggMemberMask is the member mask the aggregator counts acks under: the
// member mask, plus (planted bug only) the entries whose member was
// removed.
func (s *state) aggMemberMask() uint16 {
	m := s.memberMask
	if !TestingCountRemovedMembers {
		return m
	}
	for i := 0; i < s.spec.Replicas; i++ {
		if s.removed[i] != 0 {
			m |= 1 << i
		}
	}
	return m
}
