package replica

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"synod/kv/proto"
	"synod/kv/sm"
	"synod/paxos"
)

// Membership operations (kvctl member, through the Backend): the leader
// proposes one ConfChange, whose context is the whole resulting membership
// with addresses (members.go), and answers once the change is committed
// here. They are idempotent: a change that is already in force (a learner
// already added with the same addresses, a voter promoted, a non-member
// removed) proposes nothing and succeeds, so a client may retry after an
// unknown outcome. One change at a time (paxos): a second one while one is
// queued or uncommitted, while a leadership transfer runs, or a promotion
// of a learner that lags is refused with ErrMemberConflict and changes
// nothing.

// Errors of membership operations.
var (
	// ErrMemberConflict: another change or a transfer is in progress, or
	// the learner has not caught up; nothing was done (CONFLICT).
	ErrMemberConflict = errors.New("replica: conflicts with the membership's state")
	// ErrMemberInvalid: the change cannot apply (BAD_REQUEST).
	ErrMemberInvalid = errors.New("replica: invalid membership change")
)

// memberPollInterval is how often an operation checks whether its change
// is in force yet.
const memberPollInterval = 5 * time.Millisecond

// MemberChange is one membership change: proto.OpMemberAdd (a learner, with
// its addresses), OpMemberPromote or OpMemberRemove.
type MemberChange struct {
	Op            proto.Opcode
	ID            paxos.NodeID
	ConsensusAddr string
	ClientAddr    string
}

// ChangeMembership proposes ch on the leader and waits until it is
// committed here (or ctx ends: ErrUnavailable, the outcome is unknown).
// Errors: *NotLeaderError, ErrMemberConflict, ErrMemberInvalid,
// ErrUnavailable, ErrStopped.
func (r *Replica) ChangeMembership(ctx context.Context, ch MemberChange) error {
	if err := ch.validate(); err != nil {
		return err
	}
	if err := r.leaderOrHint(); err != nil {
		return err
	}
	type proposed struct {
		err  error
		next []sm.Member // the record proposed
		base uint64      // memberState.changes when it was proposed
	}
	done := make(chan proposed, 1)
	if err := r.control(ctx, func() {
		next, err := r.proposeMemberChange(ch)
		done <- proposed{err, next, r.members.changes}
	}); err != nil {
		return err
	}
	var p proposed
	select {
	case p = <-done:
	case <-ctx.Done():
		return fmt.Errorf("%w: %v", ErrUnavailable, ctx.Err())
	}
	switch {
	case errors.Is(p.err, errAlreadyInForce) || (p.err == nil && testingMemberWaitForState):
		// Nothing proposed, and no change was pending: the committed
		// membership has it; wait until the published view shows it.
		return r.waitFor(ctx, func(s *paxos.Status) bool { return ch.inForce(s) && r.recordHolds(ch) },
			"the change is not committed yet; its outcome is unknown")
	case p.err != nil:
		return p.err
	}
	// Wait for this change's own record to commit: a state check ("node
	// 2 is a learner") could miss it when the next change, proposed the
	// moment this one committed, undid it within one poll (the add is
	// then never answered though it committed), and could see it before
	// it commits.
	return r.waitFor(ctx, func(*paxos.Status) bool { return r.membersNow().committedSince(p.base, p.next) },
		"the change is not committed yet; its outcome is unknown")
}

// TransferLeadership hands leadership to voter to and waits until this
// node follows it (paxos TransferLeadership). A transfer to the node that
// leads, this one or the one this node follows, returns nil without a
// change, so a retry is safe. Errors as ChangeMembership.
func (r *Replica) TransferLeadership(ctx context.Context, to paxos.NodeID) error {
	if to == 0 || to >= peersMax {
		return fmt.Errorf("%w: node id %d outside 1..%d", ErrMemberInvalid, to, peersMax-1)
	}
	if err := r.leaderOrHint(); err != nil {
		if s := r.status.Load(); s.Leader == to {
			return nil // already there
		}
		return err
	}
	done := make(chan error, 1)
	if err := r.control(ctx, func() { done <- r.startTransfer(to) }); err != nil {
		return err
	}
	select {
	case err := <-done:
		if errors.Is(err, errAlreadyInForce) {
			return nil
		}
		if err != nil {
			return err
		}
	case <-ctx.Done():
		return fmt.Errorf("%w: %v", ErrUnavailable, ctx.Err())
	}
	aborted := false
	err := r.waitFor(ctx, func(s *paxos.Status) bool {
		if s.Role == paxos.RoleLeader && s.Transferring == 0 && s.Leader == r.cfg.ID {
			aborted = true
			return true
		}
		return s.Leader == to
	}, "leadership has not moved yet")
	if aborted {
		return fmt.Errorf("%w: node %d did not catch up within an election timeout; this node still leads", ErrMemberConflict, to)
	}
	return err
}

// startTransfer starts a leadership transfer to to (consensus loop):
// errAlreadyInForce when to is this leader, nothing else pending.
func (r *Replica) startTransfer(to paxos.NodeID) error {
	if to == r.cfg.ID {
		// Already there: a retry of a transfer whose answer was lost, or
		// one aimed at the leader, succeeds without a change (the
		// protocol's idempotence promise, docs/protocol.md), unless a
		// membership change is pending: it may remove this leader
		// (CONFLICT, as for every request meanwhile).
		if r.node.ConfChangePending() && !testingMemberIgnorePending {
			return fmt.Errorf("%w: a membership change is in progress; retry once it is committed", ErrMemberConflict)
		}
		return errAlreadyInForce
	}
	err := r.node.TransferLeadership(to)
	switch {
	case err == nil:
		r.log.Info().Uint64("to", uint64(to)).Msg("leadership transfer started")
	case errors.Is(err, paxos.ErrNotLeader):
		s := r.node.Status()
		err = r.notLeader(&s)
	case errors.Is(err, paxos.ErrTransferTarget):
		err = fmt.Errorf("%w: %v", ErrMemberInvalid, err)
	case errors.Is(err, paxos.ErrTransferring), errors.Is(err, paxos.ErrConfChangeBusy):
		err = fmt.Errorf("%w: %v", ErrMemberConflict, err)
	}
	// Publish the status now, not at the end of this loop input: the
	// waiter reads "leader, transferring nobody" as an aborted
	// hand-over, and must never see the status from before it began.
	s := r.node.Status()
	r.status.Store(&s)
	return err
}

// errAlreadyInForce: the change is in force already; nothing proposed.
var errAlreadyInForce = errors.New("already in force")

// proposeMemberChange builds the membership after ch and proposes it,
// returning the record proposed (consensus loop). While another change is
// queued or uncommitted it refuses (ErrMemberConflict) before looking at
// the membership: "already in force" is judged against the committed
// membership, which that change is about to replace (a remove of a node
// whose add was not yet committed was answered OK, and the node stayed).
func (r *Replica) proposeMemberChange(ch MemberChange) ([]sm.Member, error) {
	st := r.node.Status()
	if st.Role != paxos.RoleLeader {
		return nil, r.notLeader(&st)
	}
	if r.node.ConfChangePending() && !testingMemberIgnorePending {
		return nil, fmt.Errorf("%w: a membership change is already in progress; retry once it is committed", ErrMemberConflict)
	}
	cur, err := r.currentMembers(&st)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(cur, func(m sm.Member) bool { return m.ID == uint64(ch.ID) })
	next := slices.Clone(cur)
	var cc paxos.ConfChange
	switch ch.Op {
	case proto.OpMemberAdd:
		m := sm.Member{ID: uint64(ch.ID), ConsensusAddr: ch.ConsensusAddr, ClientAddr: ch.ClientAddr, Learner: true}
		if i >= 0 {
			if cur[i] == m {
				return nil, errAlreadyInForce
			}
			what := "a voter"
			if cur[i].Learner {
				what = fmt.Sprintf("a learner at %s / %s (remove it first to change its addresses)", cur[i].ConsensusAddr, cur[i].ClientAddr)
			}
			return nil, fmt.Errorf("%w: node %d is already %s", ErrMemberInvalid, ch.ID, what)
		}
		next = append(next, m)
		slices.SortFunc(next, func(a, b sm.Member) int { return cmpID(a.ID, b.ID) })
		cc.Type = paxos.ConfAddLearner
	case proto.OpMemberPromote:
		switch {
		case i < 0:
			return nil, fmt.Errorf("%w: node %d is not a member (add it as a learner first)", ErrMemberInvalid, ch.ID)
		case !cur[i].Learner:
			return nil, errAlreadyInForce
		}
		next[i].Learner = false
		cc.Type = paxos.ConfPromote
	case proto.OpMemberRemove:
		if i < 0 {
			return nil, errAlreadyInForce
		}
		next = slices.Delete(next, i, i+1)
		cc.Type = paxos.ConfRemoveNode
	default:
		return nil, fmt.Errorf("%w: %v is not a membership change", ErrMemberInvalid, ch.Op)
	}
	cc.Node, cc.Context = ch.ID, sm.EncodeMembership(next)
	err = r.node.ProposeConfChange(cc)
	switch {
	case err == nil:
		r.log.Info().Str("op", ch.Op.String()).Uint64("node", uint64(ch.ID)).Str("members", describeMembers(next)).
			Msg("membership change proposed")
		return next, nil
	case errors.Is(err, paxos.ErrNotLeader):
		return nil, r.notLeader(&st)
	case errors.Is(err, paxos.ErrConfChangeBusy):
		return nil, fmt.Errorf("%w: a membership change is already in progress; retry once it is committed", ErrMemberConflict)
	case errors.Is(err, paxos.ErrTransferring):
		return nil, fmt.Errorf("%w: a leadership transfer is in progress", ErrMemberConflict)
	case errors.Is(err, paxos.ErrLearnerBehind):
		return nil, fmt.Errorf("%w: %v; retry once it has caught up (kvctl member list shows its commit index)", ErrMemberConflict, err)
	case errors.Is(err, paxos.ErrBadConfChange):
		return nil, fmt.Errorf("%w: %v", ErrMemberInvalid, err)
	}
	return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
}

// currentMembers is the committed membership with addresses (consensus
// loop): paxos's voters and learners, each with the address its record
// gives, or the book's (a bootstrap membership has no record).
func (r *Replica) currentMembers(st *paxos.Status) ([]sm.Member, error) {
	out := make([]sm.Member, 0, len(st.Members)+len(st.Learners))
	for k, ids := range [][]paxos.NodeID{st.Members, st.Learners} {
		for _, id := range ids {
			m := sm.Member{ID: uint64(id), Learner: k == 1}
			if j := slices.IndexFunc(r.members.committed, func(x sm.Member) bool { return x.ID == uint64(id) }); j >= 0 {
				m.ConsensusAddr, m.ClientAddr = r.members.committed[j].ConsensusAddr, r.members.committed[j].ClientAddr
			} else if p, ok := r.peer(id); ok {
				m.ConsensusAddr, m.ClientAddr = p.ConsensusAddr.String(), p.ClientAddr
			} else {
				return nil, fmt.Errorf("%w: no address known for member %d", ErrUnavailable, id)
			}
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b sm.Member) int { return cmpID(a.ID, b.ID) })
	return out, nil
}

// validate checks what can be checked before the change reaches the leader.
func (ch *MemberChange) validate() error {
	if ch.ID == 0 || ch.ID >= peersMax {
		return fmt.Errorf("%w: node id %d outside 1..%d", ErrMemberInvalid, ch.ID, peersMax-1)
	}
	if ch.Op != proto.OpMemberAdd {
		return nil
	}
	if _, err := netip.ParseAddrPort(ch.ConsensusAddr); err != nil {
		return fmt.Errorf("%w: consensus address %q is not ip:port: %v", ErrMemberInvalid, ch.ConsensusAddr, err)
	}
	if _, _, err := net.SplitHostPort(ch.ClientAddr); err != nil {
		return fmt.Errorf("%w: client address %q is not host:port: %v", ErrMemberInvalid, ch.ClientAddr, err)
	}
	if len(ch.ConsensusAddr) > sm.MemberAddrBytesMax || len(ch.ClientAddr) > sm.MemberAddrBytesMax {
		return fmt.Errorf("%w: an address longer than %d bytes", ErrMemberInvalid, sm.MemberAddrBytesMax)
	}
	return nil
}

// inForce reports whether paxos's membership in s reflects ch.
func (ch *MemberChange) inForce(s *paxos.Status) bool {
	voter, learner := slices.Contains(s.Members, ch.ID), slices.Contains(s.Learners, ch.ID)
	switch ch.Op {
	case proto.OpMemberAdd:
		return learner || voter
	case proto.OpMemberPromote:
		return voter
	case proto.OpMemberRemove:
		return !voter && !learner
	}
	return false
}

// recordHolds reports whether the published membership record reflects ch
// (the reply shows it).
func (r *Replica) recordHolds(ch MemberChange) bool {
	v := r.membersNow()
	i := slices.IndexFunc(v.members, func(m sm.Member) bool { return m.ID == uint64(ch.ID) })
	switch ch.Op {
	case proto.OpMemberAdd:
		return i >= 0
	case proto.OpMemberPromote:
		return i >= 0 && !v.members[i].Learner
	case proto.OpMemberRemove:
		return i < 0
	}
	return false
}

// leaderOrHint returns nil on the leader, else its NotLeaderError.
func (r *Replica) leaderOrHint() error {
	if r.stopped.Load() {
		return ErrStopped
	}
	if s := r.status.Load(); s.Role != paxos.RoleLeader {
		return r.notLeader(s)
	}
	return nil
}

// control runs fn on the consensus loop (queued: it returns once fn is
// queued, not run).
func (r *Replica) control(ctx context.Context, fn func()) error {
	select {
	case r.controlC <- fn:
		return nil
	case <-r.stop:
		return ErrStopped
	case <-ctx.Done():
		return fmt.Errorf("%w: %v", ErrUnavailable, ctx.Err())
	}
}

// waitFor polls the published status until cond holds, ctx ends
// (ErrUnavailable with why) or the replica stops.
func (r *Replica) waitFor(ctx context.Context, cond func(*paxos.Status) bool, why string) error {
	t := time.NewTicker(memberPollInterval)
	defer t.Stop()
	for {
		s := r.Status()
		if cond(&s) {
			return nil
		}
		select {
		case <-t.C:
		case <-r.stop:
			return ErrStopped
		case <-ctx.Done():
			return fmt.Errorf("%w: %s (%v)", ErrUnavailable, why, ctx.Err())
		}
	}
}
