package replica

import (
	"context"
	"slices"
	"sync"
	"time"

	"synod/kv/proto"
	"synod/paxos"
)

// STATUS from the answering node's view. Its own row is known in full. The
// leader fills every other member's row from what it tracks (paxos
// PeerProgress): role and ballot while the member answers, the commit index
// it last reported, the highest slot it is known to hold, when it was last
// heard from, and how far its commit index lags in time. A follower knows
// of the leader only its id, ballot and when it last heard from it; every
// figure it cannot know is marked unknown (proto.Known) rather than sent as
// zero.

// progressWaitMax bounds how long a STATUS waits for the consensus loop to
// report its peers' progress; past it the peers' rows say unknown.
const progressWaitMax = 250 * time.Millisecond

// progressSnap is what the consensus loop reports for STATUS: paxos's view
// of its peers and its own status, taken at the same moment.
type progressSnap struct {
	peers  []paxos.PeerProgress
	status paxos.Status
}

// progressCall is one request for a progressSnap that concurrent STATUS
// requests share, so that a burst of them puts at most one function on
// the consensus loop's control queue.
type progressCall struct {
	done chan struct{} // closed when snap is set (or the wait ended)
	snap *progressSnap // nil: the loop did not answer in time
}

// progressCalls holds the call in flight (at most one).
type progressCalls struct {
	mu      sync.Mutex
	pending *progressCall
}

// peerProgress returns the consensus loop's view of its peers, or nil when
// the loop did not answer within progressWaitMax (or ctx ended first).
func (r *Replica) peerProgress(ctx context.Context) *progressSnap {
	pc := &r.progress
	pc.mu.Lock()
	call := pc.pending
	if call == nil {
		call = &progressCall{done: make(chan struct{})}
		pc.pending = call
		go r.runProgressCall(pc, call)
	}
	pc.mu.Unlock()
	select {
	case <-call.done:
		return call.snap
	case <-ctx.Done():
		return nil
	}
}

// runProgressCall puts one function on the control queue and publishes
// what it reports, or nil after progressWaitMax.
func (r *Replica) runProgressCall(pc *progressCalls, call *progressCall) {
	defer func() {
		pc.mu.Lock()
		pc.pending = nil
		pc.mu.Unlock()
		close(call.done)
	}()
	res := make(chan *progressSnap, 1)
	fn := func() {
		res <- &progressSnap{peers: r.node.PeerProgress(), status: r.node.Status()}
	}
	select {
	case r.controlC <- fn:
	default:
		return // the loop is busy with control work: unknown
	}
	t := time.NewTimer(progressWaitMax)
	defer t.Stop()
	select {
	case call.snap = <-res:
	case <-t.C:
	case <-r.stop:
	}
}

// clusterStatus is the STATUS reply: this node's own figures in full, the
// others' as far as this node knows them (format: the request's
// StatusFormat; the progress extension says which figures are known).
func (b *Backend) clusterStatus(ctx context.Context, format uint8) *proto.ClusterStatus {
	r := b.r
	s := r.Status()
	var peers []paxos.PeerProgress
	if len(s.Members)+len(s.Learners) > 1 {
		if ps := r.peerProgress(ctx); ps != nil {
			peers = ps.peers
			// Status from the same moment, so the peers' figures and
			// the role they were computed under agree.
			s = ps.status
			s.Applied = r.Applied() // the apply loop's, as Status reports it
		}
	}
	cs := &proto.ClusterStatus{
		Self:       uint64(r.cfg.ID),
		LeaderID:   uint64(s.Leader),
		LeaderAddr: r.PeerClientAddr(s.Leader),
		Ballot:     proto.Ballot{Round: s.Promised.Round, Node: uint64(s.Promised.Node)},
		Extended:   format >= proto.StatusFormatProgress,
	}
	members := slices.Concat(s.Members, s.Learners)
	slices.Sort(members)
	for _, id := range members {
		m := proto.MemberStatus{ID: uint64(id), Addr: r.PeerClientAddr(id)}
		if id == r.cfg.ID {
			b.ownRow(&m, &s)
		} else {
			var pp *paxos.PeerProgress
			for i := range peers {
				if peers[i].ID == id {
					pp = &peers[i]
				}
			}
			b.peerRow(&m, &s, pp)
		}
		if slices.Contains(s.Learners, id) {
			// Every node knows who the learners are (the membership).
			m.Role, m.Known = proto.RoleLearner, m.Known|proto.KnownRole
		}
		cs.Members = append(cs.Members, m)
	}
	return cs
}

// ownRow fills the answering node's own row.
func (b *Backend) ownRow(m *proto.MemberStatus, s *paxos.Status) {
	m.Role = proto.Role(s.Role)
	m.Ballot = proto.Ballot{Round: s.Promised.Round, Node: uint64(s.Promised.Node)}
	m.Commit, m.Applied, m.Acked = uint64(s.Commit), uint64(s.Applied), uint64(s.LastSlot)
	m.Reachable = true
	m.Known = proto.KnownRole | proto.KnownCommit | proto.KnownApplied | proto.KnownReachable | proto.KnownAcked | proto.KnownHeard
	if s.Role == paxos.RoleLeader {
		m.Known |= proto.KnownLag // the leader's commit is the reference: no lag
	}
}

// peerRow fills another member's row from what this node knows of it (pp
// nil: nothing, the consensus loop did not answer).
func (b *Backend) peerRow(m *proto.MemberStatus, s *paxos.Status, pp *paxos.PeerProgress) {
	r := b.r
	tick := r.cfg.Tick
	reachable := false
	if pp != nil && pp.Heard {
		m.HeardAgo = time.Duration(pp.HeardAgoTicks) * tick
		m.Known |= proto.KnownHeard
		// Heard within an election timeout: what a follower's own
		// election timer, and the leader's check-quorum, call alive.
		reachable = pp.HeardAgoTicks < int64(r.cfg.ElectionTicks)
	}
	switch {
	case pp != nil && pp.Tracked:
		// The leader's view of a member it replicates to: reachable or
		// not, and its slots once it answered this leader (a member down
		// since before it led has reported none: unknown, not 0).
		m.Reachable = reachable
		m.Known |= proto.KnownReachable
		if pp.Reported {
			m.Known |= proto.KnownCommit | proto.KnownAcked | proto.KnownLag
			m.Commit, m.Acked = uint64(pp.Commit), uint64(pp.Acked)
			m.Lag, m.LagAtLeast = time.Duration(pp.LagTicks)*tick, pp.LagAtLeast
		}
		if reachable {
			// It answers under this leader's ballot: it follows it.
			m.Role = proto.RoleFollower
			m.Ballot = proto.Ballot{Round: s.Ballot.Round, Node: uint64(s.Ballot.Node)}
			m.Known |= proto.KnownRole
		}
	case paxos.NodeID(m.ID) == s.Leader:
		// A follower's view of its leader: who it is and whether it
		// hears from it; its slots are not known here.
		m.Role = proto.RoleLeader
		m.Ballot = proto.Ballot{Round: s.Promised.Round, Node: uint64(s.Promised.Node)}
		m.Known |= proto.KnownRole
		if pp != nil {
			m.Reachable = reachable
			m.Known |= proto.KnownReachable
		}
	}
}
