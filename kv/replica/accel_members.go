package replica

import (
	"slices"

	"synod/accel"
	"synod/paxos"
)

// The plane's member table follows the voters (accel/doc.go, "Wiring"):
// a learner is not in it, so its acks never count toward a commit or the
// plane's lease. The table has accel.ReplicasMax entries; a member keeps
// its entry for as long as it is a voter (the ack bits of slots in flight
// are indexed by entry, so moving one would drop or misattribute acks), a
// removed voter's entry is cleared, a new voter takes the first free one,
// and the quorum register is rewritten. With more voters than entries the
// extra ones are left out and logged: the plane then commits later than
// software, never wrongly (the checker excuses a software-only commit).

// syncMembers rewrites the table when the voters changed (consensus loop,
// from registers).
func (a *accelMirror) syncMembers(voters []paxos.NodeID) {
	if slices.Equal(voters, a.voters) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.setMembersLocked(voters)
	a.flushLocked()
}

// setMembersLocked writes the table for voters (a.mu held).
func (a *accelMirror) setMembersLocked(voters []paxos.NodeID) {
	p, self := a.plane, a.r.cfg.ID
	for i, id := range a.table {
		if id != 0 && !slices.Contains(voters, id) {
			a.table[i] = 0
			a.buf = p.SetMember(a.buf, i, 0)
		}
	}
	for _, id := range voters {
		if slices.Contains(a.table[:], id) {
			continue
		}
		i := slices.Index(a.table[:], 0)
		if i < 0 {
			a.r.log.Error().Uint64("member", uint64(id)).Int("entries", accel.ReplicasMax).
				Msg("accel: more voters than member-table entries; this voter's acks are not counted by the plane")
			continue
		}
		a.table[i] = id
		a.buf = p.SetMember(a.buf, i, id)
	}
	if i := slices.Index(a.table[:], self); i >= 0 {
		a.buf = p.SetSelf(a.buf, i)
	}
	a.buf = p.SetQuorum(a.buf, max(len(voters)/2+1, 1))
	a.voters = slices.Clone(voters)
}
