package paxossim

import (
	"slices"

	"synod/paxos"
)

// Leadership hand-overs (paxos TransferLeadership, the operator's
// `kvctl member transfer-leadership`, and TransferLeadershipNow, a stuck
// leader's in kv/replica), with Options.LeaderTransfers or the
// membership-heavy profile: now and then the live leader is asked to hand
// over to another voter, chosen at random (up or down, caught up or not),
// one time in handOverNowOneIn at once (whatever is in flight: the
// target's phase 1 must find it), under whatever faults the run injects. The hand-over releases the
// acceptors' leases before the target campaigns, so the lease oracle
// (lease.go) is what checks it: no node may hold a lease that the
// acceptors' refusal windows do not cover. The planted twin
// (paxos.TestingTransferKeepsLease: release without stepping down) must
// be caught by it (planted_test.go).

// Hand-over rates, in parts per million per tick.
const (
	handOverPerTickPPM      = 15_000
	heavyHandOverPerTickPPM = 30_000
	// handOverNowOneIn: one hand-over in this many is asked at once.
	handOverNowOneIn = 3
)

// handOver is a hand-over started and not yet seen complete.
type handOver struct {
	to     paxos.NodeID
	ballot paxos.Ballot // the leader's when it was asked
}

// handOverStep may ask the leader to hand over (fault phase only), and
// counts hand-overs that completed: the target leads under a higher
// ballot.
func (s *sim) handOverStep(tick int64) {
	if !s.opts.LeaderTransfers && !s.opts.MembershipHeavy {
		return
	}
	if h := s.handOver; h != nil {
		for _, sn := range s.nodes {
			if sn.id == h.to && sn.up() {
				if st := sn.n.Status(); st.Role == paxos.RoleLeader && h.ballot.Less(st.Ballot) {
					s.result.Counts.TransfersDone++
					s.handOver = nil
				}
			}
		}
	}
	rate := uint32(handOverPerTickPPM)
	if s.opts.MembershipHeavy {
		rate = heavyHandOverPerTickPPM
	}
	if s.liveness || !s.r.ppm(s.rate(rate)) {
		return
	}
	var leader *simNode
	for _, sn := range s.nodes {
		if sn.up() && !sn.paused() && sn.n.Status().Role == paxos.RoleLeader {
			leader = sn
		}
	}
	if leader == nil {
		return
	}
	st := leader.n.Status()
	targets := slices.DeleteFunc(slices.Clone(st.Members), func(id paxos.NodeID) bool { return id == leader.id })
	if len(targets) == 0 {
		return
	}
	to := targets[s.r.intn(len(targets))]
	now := s.r.intn(handOverNowOneIn) == 0
	transfer, how := leader.n.TransferLeadership, "hands over"
	if now {
		transfer, how = leader.n.TransferLeadershipNow, "hands over at once"
	}
	err := transfer(to)
	s.process(leader)
	if err != nil {
		s.tracef("hand-over: node %d refused to hand over to %d (now=%v): %v", leader.id, to, now, err)
		return
	}
	s.tracef("hand-over: node %d %s to %d (commit %d, last slot %d)", leader.id, how, to, st.Commit, st.LastSlot)
	s.result.Counts.Transfers++
	if now {
		s.result.Counts.TransfersNow++
	}
	s.result.FaultCount++
	s.handOver = &handOver{to: to, ballot: st.Ballot}
}
