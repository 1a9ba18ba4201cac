package paxossim

import "synod/paxos"

// The lease oracle checks the lease rules against the simulator's real
// (global) time, which no node sees. Two properties:
//
//  1. Cover: while a leader X holds a valid lease, until global time E (the
//     moment X's own clock reaches its LeaderUntil), the acceptors that
//     refuse every ballot but X's until E or later leave too few others to
//     form a majority of X's membership, so no candidate can complete
//     phase 1 before E. An acceptor refuses if it is X itself, is down (it
//     cannot promise; the refusal it must keep after restarting is checked
//     once it is up), or holds a refusal window (granted to X, or to
//     nobody after a restart) that its own clock ends no earlier than E.
//     Blocking the latest or the committed membership will do: with one
//     change at a time, a candidate needs a majority of every membership it
//     adopts, and a chosen change is reported by every majority of the
//     membership before it.
//  2. Lease reads: when X answers a read from its lease at ballot b, no
//     node has committed a slot at a ballot above b by then.
//
// Cover is what makes lease reads safe, and it fails first: a lease dated
// from the arrival of the acks, a restarted acceptor that does not refuse,
// a lease not reduced by the drift bound each leave a moment where the
// leader believes a lease that the acceptors no longer back, whether or not
// the schedule then elects another leader in that gap. The lease-stress
// fault profile (FaultLease) makes those moments common: heartbeat acks
// delayed close to the lease's end, node pauses just around LeaseTicks,
// restarts within LeaseTicks.
type leaseOracle struct {
	checks, violations int
	reported           leaseKey // the last lease reported, so each is reported once
	// topCommit is the highest ballot at which any leader counted a slot
	// committed so far (AckEvent.Committed), and who.
	topCommit paxos.Ballot
}

type leaseKey struct {
	node        paxos.NodeID
	until       int64
	incarnation int
}

// global converts a node's clock reading (its ticks since NewNode) into
// simulated time: tick k (k >= 1) of an incarnation happens at
// firstTickAt + (k-1)*period, whether or not the node was paused then.
func (sn *simNode) global(ticks int64) int64 {
	if ticks <= 0 {
		return sn.startedAt
	}
	return sn.firstTickAt + (ticks-1)*sn.periodMicros
}

// checkLeases runs the cover check for every node that holds a lease now.
func (s *sim) checkLeases() {
	for _, sn := range s.nodes {
		if !sn.up() || sn.paused() {
			continue
		}
		ls := sn.n.LeaseState()
		if ls.LeaderUntil <= ls.Now {
			continue
		}
		s.checkCover(sn, ls)
	}
}

func (s *sim) checkCover(leader *simNode, ls paxos.LeaseState) {
	s.lease.checks++
	end := leader.global(ls.LeaderUntil)
	covers := func(id paxos.NodeID) bool {
		if id == leader.id {
			return true
		}
		sn := s.byID[id]
		if sn == nil {
			return false
		}
		if !sn.up() {
			return true // down: it cannot promise anything now
		}
		g := sn.n.LeaseState()
		return (g.GrantedTo == leader.id || g.GrantedTo == 0) && sn.global(g.GrantedUntil) >= end
	}
	// blocks: the members that do not refuse cannot form a majority.
	blocks := func(members []paxos.NodeID) bool {
		free := 0
		for _, id := range members {
			if !covers(id) {
				free++
			}
		}
		return len(members) > 0 && free < len(members)/2+1
	}
	latest := leader.n.Status().Members
	if blocks(latest) || blocks(s.members) {
		return
	}
	if s.lease.reported == (leaseKey{leader.id, ls.LeaderUntil, leader.incarnation}) {
		return // this lease was reported already
	}
	s.lease.reported = leaseKey{leader.id, ls.LeaderUntil, leader.incarnation}
	var who []paxos.NodeID
	for _, id := range latest {
		if covers(id) {
			who = append(who, id)
		}
	}
	s.violateLease("lease cover: node %d leads with a lease until t=%d.%03d, but only %v of %v refuse other ballots that long",
		leader.id, end/microsPerTick, end%microsPerTick, who, latest)
}

// leaseRead checks a read answered from node sn's lease (property 2).
func (s *sim) leaseRead(sn *simNode, rs paxos.ReadState) {
	if !rs.ByLease {
		return
	}
	s.lease.checks++
	b := sn.n.Status().Ballot
	if b.Less(s.lease.topCommit) {
		s.violateLease("lease read: node %d answered read %d from its lease at ballot %v after a slot was committed at ballot %v",
			sn.id, rs.ID, b, s.lease.topCommit)
	}
}

// violateLease records a lease oracle violation (a safety violation).
func (s *sim) violateLease(format string, args ...any) {
	s.lease.violations++
	s.chk.violateSafety(format, args...)
}

// noteCommit records a leader's commit decision for the lease-read check.
func (s *sim) noteCommit(a *paxos.AckEvent) {
	if a.Committed && s.lease.topCommit.Less(a.Ballot) {
		s.lease.topCommit = a.Ballot
	}
}
