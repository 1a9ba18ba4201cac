package replica

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"synod/paxos"
)

// A leader that commits nothing says so.
//
// A leader whose followers cannot take its Accepts (both fetching a
// snapshot, their acceptor logs at the admission line) holds a valid lease
// and answers heartbeats, so nothing about it is stuck by the hand-over's
// measure (stuck.go: another leader would wait on the same followers), yet
// no write commits. An outside run saw 15 s of that under every node's
// `"stuck":false`. commitWatch measures it: CommitWait is how long the
// leader has had entries above its commit index without the index moving
// (/status commit_wait_ms), and past commitWaitLogAfter the leader logs
// once what each voter last reported, and again when it commits.
const commitWaitLogAfter = stuckAfter

// commitWatch is the consensus loop's measure of a standing commit index;
// since is read from any goroutine.
type commitWatch struct {
	commit paxos.Slot
	logged bool
	since  atomic.Int64 // UnixNano when the commit index last stood with entries above it; 0 while nothing waits
}

// watchCommit updates the measure from the published status s (consensus
// loop, every stuckCheckEvery).
func (r *Replica) watchCommit(s *paxos.Status, now time.Time) {
	w := &r.commitWait
	waiting := s.Role == paxos.RoleLeader && s.LastSlot > s.Commit
	moved := s.Commit != w.commit
	since := time.Unix(0, w.since.Load())
	if w.logged && (!waiting || moved) {
		r.log.Info().Uint64("commit", uint64(s.Commit)).Dur("after", now.Sub(since)).Msg("leader commits again")
		w.logged = false
	}
	switch {
	case !waiting:
		w.since.Store(0)
	case w.since.Load() == 0 || moved:
		w.since.Store(now.UnixNano())
	case !w.logged && now.Sub(since) >= commitWaitLogAfter:
		w.logged = true
		r.log.Warn().Uint64("commit", uint64(s.Commit)).Uint64("last_slot", uint64(s.LastSlot)).
			Dur("for", now.Sub(since)).Str("voters", r.peerCommits()).
			Msg("leader commits nothing: no quorum takes its accepts (followers behind: fetching a snapshot, or their logs full)")
	}
	w.commit = s.Commit
}

// peerCommits describes what each voter last reported to this leader.
func (r *Replica) peerCommits() string {
	var b strings.Builder
	for _, p := range r.node.PeerProgress() {
		if p.Learner || !p.Tracked {
			continue
		}
		fmt.Fprintf(&b, "%d:commit=%d,acked=%d,active=%v ", p.ID, p.Commit, p.Acked, p.Active)
	}
	return strings.TrimSpace(b.String())
}

// CommitWait is how long this node, leading, has had entries above its
// commit index without the index moving; 0 when it does not lead or
// nothing waits. Safe from any goroutine.
func (r *Replica) CommitWait() time.Duration {
	since := r.commitWait.since.Load()
	if since == 0 {
		return 0
	}
	return max(0, r.cfg.Now().Sub(time.Unix(0, since)))
}
