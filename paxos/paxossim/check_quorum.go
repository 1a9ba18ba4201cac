package paxossim

import (
	"fmt"
	"slices"

	"synod/paxos"
)

// The voter-quorum oracle. Every slot a node treats as committed must have
// been chosen by a majority of the VOTERS of the configuration governing
// that slot, counting only durable acceptances:
//
//   - commit claims: when a leader reports a Committed AckEvent for
//     (slot, ballot), the acceptors whose durable store held that
//     (slot, ballot) at that moment must include a majority of the slot's
//     voters; or, failing that, the value the leader committed must
//     already have been chosen (a majority of the slot's voters durably
//     accepted it under one ballot: a follower may ack a slot it has
//     committed without holding it at the leader's ballot, which is
//     harmless). A claim is judged once the leader delivers the slot with
//     its entry under that ballot, which proves the leader committed it:
//     the event marks the ack that gave the slot a quorum, which may come
//     before the slots below it commit, and another leader may then choose
//     at a lower slot a ConfChange that changes the slot's voters; the
//     leader, which commits slots in order, never commits that slot under
//     its ballot (membership-heavy seed 5007). A claim whose leader
//     delivers the slot under another ballot, or never delivers it, is
//     dropped; the applies below still check that slot.
//   - applies: every entry any node applies (Ready.Committed) must carry a
//     value that, when applied, a majority of the slot's voters had durably
//     accepted under one ballot.
//
// "Durable" is what checker.accepted recorded: a follower's Ready.Accepted
// when its Ready is persisted, a leader's own acceptance only when its own
// write completed (ownpersist.go writeOwn, before OwnAcceptedDurable), so a
// leader's own vote counts only once durable, as the core must count it.
//
// The configuration governing a slot is taken from the log itself, not from
// any node's core: the simulator's application restates the membership
// rules independently (membership.go applyConfChange), and the membership a
// replica holds after applying slot s (or installing a snapshot at s) is the
// one governing slot s+1 (a ConfChange at s governs the slots above s; the
// old membership governs s itself). The genesis membership governs slot 1.
// Learners are never voters. The first replica to reach a slot records it;
// replicas that disagree later are the state check's business.
//
// A leader may commit a slot before any replica has applied the slot below
// it, so its configuration is not known yet: the claim is kept, with a copy
// of the durable acceptances it was made on, and judged once the
// configuration is known. Claims still waiting when the run ends (only a
// run cut short can leave any) are not judged.
//
// Violations count toward Result.Violations and Result.QuorumViolations,
// not SafetyViolations: those are the end-to-end oracles the planted tests
// require beside this one (planted_test.go).

// quorumReportsMax is how many quorum violations one run describes (one bug
// usually breaks many slots: keep room for what else the run found).
const quorumReportsMax = 3

// quorumOracle is the voter-quorum oracle's state for one run.
type quorumOracle struct {
	// accepts is the checker's durable-acceptance record, shared.
	accepts map[slotBallot]*acceptRecord
	// ballots lists, per slot, every ballot with a durable acceptance.
	ballots map[paxos.Slot][]paxos.Ballot
	// voters of the configuration governing each slot, once known.
	voters map[paxos.Slot][]paxos.NodeID
	// chosen caches, per slot, the value proved chosen by a voter majority
	// (chosen-ness never goes away: acceptances are never undone, and a
	// waiting claim's copy is a subset of the acceptances since).
	chosen map[paxos.Slot]uint64
	// pending holds the claims whose slot's configuration is not known
	// yet.
	pending map[paxos.Slot][]quorumClaim
	// unconfirmed holds, per leader, its commit claims for slots it has
	// not delivered yet; delivered, per node, the ballot of the entry it
	// delivered at each slot.
	unconfirmed map[paxos.NodeID]map[paxos.Slot][]quorumClaim
	delivered   map[paxos.NodeID]map[paxos.Slot]paxos.Ballot

	checks, violations int
	// unknown counts applies whose slot's configuration was not known
	// (none expected: a replica applies a slot after the one below).
	unknown int
}

// quorumClaim is one claim that a slot is committed, kept with the durable
// acceptances of its slot as they were when it was made.
type quorumClaim struct {
	node   paxos.NodeID
	slot   paxos.Slot
	ballot paxos.Ballot // the Committed AckEvent's; zero for an apply
	leader bool         // a Committed AckEvent (else an apply)
	value  uint64
	hasVal bool
	// waited: the claim waited for its configuration; votes is then the
	// copy of the slot's durable acceptances when it was made.
	waited bool
	votes  []ballotVotes
}

// ballotVotes is a copy of one (slot, ballot)'s durable acceptances.
type ballotVotes struct {
	ballot paxos.Ballot
	value  uint64
	nodes  []paxos.NodeID
}

func newQuorumOracle(accepts map[slotBallot]*acceptRecord) *quorumOracle {
	return &quorumOracle{
		accepts: accepts,
		ballots: map[paxos.Slot][]paxos.Ballot{},
		voters:  map[paxos.Slot][]paxos.NodeID{},
		chosen:  map[paxos.Slot]uint64{},
		pending: map[paxos.Slot][]quorumClaim{},

		unconfirmed: map[paxos.NodeID]map[paxos.Slot][]quorumClaim{},
		delivered:   map[paxos.NodeID]map[paxos.Slot]paxos.Ballot{},
	}
}

// newBallot records that (slot, b) got its first durable acceptance.
func (q *quorumOracle) newBallot(slot paxos.Slot, b paxos.Ballot) {
	q.ballots[slot] = append(q.ballots[slot], b)
}

// governs records that voters govern slot (the first report wins) and
// judges the claims that waited for it.
func (q *quorumOracle) governs(c *checker, slot paxos.Slot, voters []paxos.NodeID) {
	if _, ok := q.voters[slot]; ok {
		return
	}
	q.voters[slot] = slices.Clone(voters)
	for _, cl := range q.pending[slot] {
		q.judge(c, &cl)
	}
	delete(q.pending, slot)
}

// votesNow lists slot's durable acceptances as they are now; copy makes
// them a copy that later acceptances leave alone (for a waiting claim).
func (q *quorumOracle) votesNow(slot paxos.Slot, copy bool) []ballotVotes {
	var out []ballotVotes
	for _, b := range q.ballots[slot] {
		r := q.accepts[slotBallot{slot, b}]
		nodes := r.nodes
		if copy {
			nodes = slices.Clone(nodes)
		}
		out = append(out, ballotVotes{ballot: b, value: r.value, nodes: nodes})
	}
	return out
}

// committed is the hook for a leader's Committed AckEvent: the claim,
// with a copy of the slot's durable acceptances now, waits until the
// leader delivers the slot (it may have already, in the same Ready).
func (q *quorumOracle) committed(c *checker, leader paxos.NodeID, ev *paxos.AckEvent) {
	cl := quorumClaim{node: leader, slot: ev.Slot, ballot: ev.Ballot, leader: true}
	if r := q.accepts[slotBallot{ev.Slot, ev.Ballot}]; r != nil {
		cl.value, cl.hasVal = r.value, true
	}
	cl.waited, cl.votes = true, q.votesNow(cl.slot, true)
	if b, ok := q.delivered[leader][cl.slot]; ok {
		q.claimIfDelivered(c, cl, b)
		return
	}
	if q.unconfirmed[leader] == nil {
		q.unconfirmed[leader] = map[paxos.Slot][]quorumClaim{}
	}
	q.unconfirmed[leader][cl.slot] = append(q.unconfirmed[leader][cl.slot], cl)
}

// confirm runs when node delivers slot s holding an entry under ballot b:
// its claims for s under b are judged, the others dropped.
func (q *quorumOracle) confirm(c *checker, node paxos.NodeID, s paxos.Slot, b paxos.Ballot) {
	if q.delivered[node] == nil {
		q.delivered[node] = map[paxos.Slot]paxos.Ballot{}
	}
	q.delivered[node][s] = b
	for _, cl := range q.unconfirmed[node][s] {
		q.claimIfDelivered(c, cl, b)
	}
	delete(q.unconfirmed[node], s)
}

// claimIfDelivered judges leader claim cl, whose slot its leader
// delivered under ballot b, if b is the claim's (the leader committed it),
// and drops it otherwise.
func (q *quorumOracle) claimIfDelivered(c *checker, cl quorumClaim, b paxos.Ballot) {
	if cl.ballot == b || testingJudgeUnconfirmedClaims {
		q.claim(c, cl)
	}
}

// testingJudgeUnconfirmedClaims, test only: a leader's commit claim is
// judged whatever ballot the leader delivers the slot under (the oracle
// before the confirmation), so TestQuorumOracleJudgesOnlyCommits shows the
// false positive of membership-heavy seed 5007.
var testingJudgeUnconfirmedClaims bool

// applied is the hook for a node applying committed entry e.
func (q *quorumOracle) applied(c *checker, node paxos.NodeID, e *paxos.Entry) {
	q.confirm(c, node, e.Slot, e.Ballot)
	v := entryValue(e)
	if ch, ok := q.chosen[e.Slot]; ok && ch == v {
		q.checks++
		return
	}
	if _, ok := q.voters[e.Slot]; !ok {
		q.unknown++
	}
	q.claim(c, quorumClaim{node: node, slot: e.Slot, value: v, hasVal: true})
}

// claim judges cl now if its slot's configuration is known, else keeps it
// with a copy of the slot's durable acceptances.
func (q *quorumOracle) claim(c *checker, cl quorumClaim) {
	if _, ok := q.voters[cl.slot]; ok {
		q.judge(c, &cl)
		return
	}
	if !cl.waited {
		cl.waited, cl.votes = true, q.votesNow(cl.slot, true)
	}
	q.pending[cl.slot] = append(q.pending[cl.slot], cl)
}

// judge checks one claim against its slot's voters (known by now); the
// durable acceptances are the claim's copy if it waited, else the current
// ones.
func (q *quorumOracle) judge(c *checker, cl *quorumClaim) {
	q.checks++
	voters := q.voters[cl.slot]
	votes := cl.votes
	if !cl.waited {
		votes = q.votesNow(cl.slot, false)
	}
	need := len(voters)/2 + 1
	count := func(nodes []paxos.NodeID) int {
		n := 0
		for _, id := range nodes {
			if slices.Contains(voters, id) {
				n++
			}
		}
		return n
	}
	atBallot := 0
	for i := range votes {
		if cl.leader && votes[i].ballot == cl.ballot {
			atBallot = count(votes[i].nodes)
			if atBallot >= need {
				q.chosen[cl.slot] = votes[i].value
				return
			}
		}
	}
	for i := range votes {
		if (!cl.hasVal || votes[i].value == cl.value) && count(votes[i].nodes) >= need {
			q.chosen[cl.slot] = votes[i].value
			return
		}
	}
	q.violations++
	c.count++
	if q.violations > quorumReportsMax || len(c.violations) >= violationsMax {
		return
	}
	if cl.leader {
		c.violations = append(c.violations, fmt.Sprintf(
			"slot %d ballot %v: leader %d committed with %d durable acceptances from the slot's voters %v (majority %d), and no voter majority had durably accepted its value under any ballot",
			cl.slot, cl.ballot, cl.node, atBallot, voters, need))
		return
	}
	c.violations = append(c.violations, fmt.Sprintf(
		"slot %d: node %d applied a value that no majority of the slot's voters %v (majority %d) had durably accepted under one ballot",
		cl.slot, cl.node, voters, need))
}

// q returns the checker's voter-quorum oracle, made on first use.
func (c *checker) q() *quorumOracle {
	if c.quorums == nil {
		c.quorums = newQuorumOracle(c.accepts)
	}
	return c.quorums
}
