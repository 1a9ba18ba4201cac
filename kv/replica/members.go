package replica

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"synod/kv/sm"
	"synod/paxos"
)

// Membership at run time. The membership a node uses is the one committed
// in the log: every change is a paxos ConfChange whose context is the whole
// resulting membership with every member's addresses (sm.EncodeMembership),
// and applying it stores that record in the state machine, atomically with
// the slot (sm.ApplyMembership), so it is durable with the data and
// travels in snapshots. At start the node reads the record back
// (initMembership): the config's peers only bootstrap a cluster whose log
// never changed its membership, and a config that disagrees with the record
// is logged and overruled.
//
// The runtime's peer tables follow the log at run time (refreshPeers, on
// the consensus loop): the address book every loop reads (peerBook: the
// send loop's datagram addresses, the side channel's and snapshot
// transfers' TCP peers, NOT_LEADER hints, STATUS rows), the senders the
// authenticator admits (and their replay windows), the nodes paxos accepts
// messages from, and the accel plane's member table (accel_members.go).
// The book holds the committed membership, the one before it (so a removed
// member still hears of its removal for a while), the membership of a
// change accepted but not yet committed (so a leader reaches a new learner
// the moment the change commits; after a restart, the last change the
// acceptor log recovered above the applied slot, recoverPendingMembership),
// and this node. Everything in it is bounded by 3 x paxos.MembersMax.

// Compile-time: the state machine's membership bound is paxos's.
var _ = [1]struct{}{}[sm.MembersMax-paxos.MembersMax]

// peerBook is an immutable address book; the consensus loop replaces it
// whole (Replica.book).
type peerBook struct {
	byID map[paxos.NodeID]Peer
	// members are the ids of the committed and the pending membership:
	// the nodes entitled to the state (a snapshot), which the departed
	// members kept in byID are not.
	members map[paxos.NodeID]bool
}

// isMember reports whether id is in the committed or the pending
// membership (a departed member in the book is not). Safe from any
// goroutine.
func (r *Replica) isMember(id paxos.NodeID) bool {
	b := r.book.Load()
	if testingSnapServesDeparted {
		_, ok := b.byID[id] // the rule before: anyone in the book
		return ok
	}
	return b.members[id]
}

// peer returns member id's addresses (ok false when the book does not
// hold it). Safe from any goroutine.
func (r *Replica) peer(id paxos.NodeID) (Peer, bool) {
	p, ok := r.book.Load().byID[id]
	return p, ok
}

// memberState is the consensus loop's view of the membership records.
type memberState struct {
	// committed is the committed membership with addresses: the record
	// of the last ConfChange applied, or at bootstrap the configured
	// peers (slot 0, record false).
	committed []sm.Member
	slot      paxos.Slot
	record    bool
	// previous is the membership before committed (departed members).
	previous []sm.Member
	// pending is the membership of a ConfChange accepted here at
	// pendingSlot and not yet committed (nil: none).
	pending     []sm.Member
	pendingSlot paxos.Slot
	// joining: started with Config.Join and no membership known yet.
	joining bool
	// learned are the contacts a joining node learned from members'
	// authenticated packets (learnContact): senders its config does not
	// list, such as a leader elected since the config was written. In the
	// book only while joining; at most one per node id.
	learned map[paxos.NodeID]Peer
	// checked: noteRemoved ran once (at start); wasMember: this node has
	// been in the committed membership since it started.
	checked, wasMember bool
	// changes counts the ConfChanges this process saw committed; recent
	// holds the records of the last recentChangesMax of them, oldest
	// first. A membership operation waits for its own record among them
	// (committedSince), not for a state that a later change may undo.
	changes uint64
	recent  []committedChange
}

// recentChangesMax bounds memberState.recent. One change commits at a time
// and its operation polls every memberPollInterval, so a change is looked
// for among at most a few later ones.
const recentChangesMax = 8

// committedChange is one committed ConfChange: its record, and its number
// among those committed since the process started (1 for the first).
type committedChange struct {
	seq     uint64
	members []sm.Member
}

// memberView is what the consensus loop publishes for membership
// operations and STATUS (Replica.members).
type memberView struct {
	members []sm.Member
	slot    paxos.Slot
	pending bool
	recent  []committedChange // memberState.recent, shared: never modified
}

// committedSince reports whether a ConfChange whose record is members
// committed after the first base ones (memberState.changes when it was
// proposed).
func (v *memberView) committedSince(base uint64, members []sm.Member) bool {
	for _, c := range v.recent {
		if c.seq > base && slices.Equal(c.members, members) {
			return true
		}
	}
	return false
}

// membersNow returns the published view (never nil after New).
func (r *Replica) membersNow() *memberView { return r.memberView.Load() }

// peerFromMember converts a record entry; ok is false when its consensus
// address does not parse (a record written by a buggy or hostile leader).
func peerFromMember(m sm.Member) (Peer, bool) {
	ap, err := netip.ParseAddrPort(m.ConsensusAddr)
	if err != nil {
		return Peer{}, false
	}
	return Peer{ID: paxos.NodeID(m.ID), ConsensusAddr: ap, ClientAddr: m.ClientAddr}, true
}

// memberFromPeer converts a configured peer into a record entry.
func memberFromPeer(p Peer, learner bool) sm.Member {
	return sm.Member{ID: uint64(p.ID), ConsensusAddr: p.ConsensusAddr.String(), ClientAddr: p.ClientAddr, Learner: learner}
}

// splitMembers returns the voters and learners of a record.
func splitMembers(ms []sm.Member) (voters, learners []paxos.NodeID) {
	for _, m := range ms {
		if m.Learner {
			learners = append(learners, paxos.NodeID(m.ID))
		} else {
			voters = append(voters, paxos.NodeID(m.ID))
		}
	}
	return voters, learners
}

// membershipStore is what initMembership needs of the state machine.
type membershipStore interface {
	Membership() (sm.Membership, bool, error)
	Applied() uint64
}

// initMembership decides the membership the node starts with (see the
// file comment) and returns paxos's view of it: the voters and learners,
// and whether the node starts as a joiner. It fills r.members and the
// book. Called by New before the paxos node exists.
func (r *Replica) initMembership(cfg *Config, stm membershipStore) (voters, learners []paxos.NodeID, join bool, err error) {
	ms := &r.members
	rec, ok, err := stm.Membership()
	if err != nil {
		return nil, nil, false, fmt.Errorf("reading the committed membership: %w", err)
	}
	var configured []sm.Member
	for _, p := range cfg.Peers {
		configured = append(configured, memberFromPeer(p, false))
	}
	slices.SortFunc(configured, func(a, b sm.Member) int { return cmpID(a.ID, b.ID) })
	switch {
	case ok:
		ms.committed, ms.slot, ms.record = rec.Members, paxos.Slot(rec.Slot), true
		if diff := membershipDiff(configured, rec.Members); diff != "" {
			r.log.Warn().Uint64("slot", rec.Slot).Str("difference", diff).
				Msg("the config's [[peers]] differ from the membership committed in the log; following the log (the peers only bootstrap a new cluster)")
		}
		if cfg.Join {
			r.log.Info().Msg("--join ignored: this node already holds the committed membership")
		}
	case cfg.Join && stm.Applied() == 0:
		// A new node: it knows no membership until a snapshot gives it
		// one; its configured peers are only whom to listen to.
		ms.joining = true
		ms.committed = configured
		r.log.Info().Msg("joining: waiting to be added to the membership (kvctl member add), then catching up by snapshot")
	default:
		if cfg.Join {
			r.log.Info().Uint64("applied", stm.Applied()).Msg("--join ignored: this node holds state")
		}
		ms.committed = configured // bootstrap: every configured peer votes
	}
	voters, learners = splitMembers(ms.committed)
	r.refreshBook(cfg) // warns when this node is not in the membership (noteRemoved)
	return voters, learners, ms.joining, nil
}

// refreshBook rebuilds the address book from the records and this node's
// configured addresses, and publishes the membership view.
func (r *Replica) refreshBook(cfg *Config) {
	ms := &r.members
	book := &peerBook{byID: make(map[paxos.NodeID]Peer, len(ms.committed)+len(ms.previous)+len(ms.pending)+1),
		members: make(map[paxos.NodeID]bool, len(ms.committed)+len(ms.pending))}
	for _, set := range [][]sm.Member{ms.committed, ms.pending} {
		for _, m := range set {
			book.members[paxos.NodeID(m.ID)] = true
		}
	}
	for _, set := range [][]sm.Member{ms.previous, ms.committed, ms.pending} {
		for _, m := range set {
			p, ok := peerFromMember(m)
			if !ok {
				r.log.Error().Uint64("member", m.ID).Str("consensus_addr", m.ConsensusAddr).
					Msg("a membership record names an unusable consensus address; this member is unreachable from here")
				continue
			}
			book.byID[p.ID] = p
		}
	}
	for _, p := range cfg.Peers {
		if p.ID == cfg.ID {
			if q, ok := book.byID[p.ID]; ok && q.ConsensusAddr != p.ConsensusAddr {
				r.log.Warn().Str("committed", q.ConsensusAddr.String()).Str("configured", p.ConsensusAddr.String()).
					Msg("this node's consensus address differs from the one the membership records: peers send to the recorded one")
			}
			book.byID[p.ID] = p // this node's own addresses are its config's
		} else if ms.joining {
			book.byID[p.ID] = p // a joiner's contacts
		}
	}
	if ms.joining {
		for id, p := range ms.learned {
			if _, ok := book.byID[id]; !ok {
				book.byID[id] = p
			}
		}
	}
	r.joining.Store(ms.joining && cfg.Auth != nil)
	r.book.Store(book)
	v := &memberView{members: slices.Clone(ms.committed), slot: ms.slot, pending: ms.pending != nil, recent: ms.recent}
	r.memberView.Store(v)
	r.noteRemoved(cfg.ID)
}

// noteRemoved records whether this node is outside the committed
// membership (Replica.Removed), and says so once when it becomes so: a
// removed node that keeps running still answers as a follower of the
// leader it last knew, with a commit index that no longer moves (nobody
// sends it the log), which an operator cannot tell from a healthy one.
// A node that never hears of the change (the leader stopped sending to it
// first) cannot know; `kvctl member list` on the leader is the truth.
//
// Only a node that was a member (or, at start, is not joining) counts: a
// joiner that installs a snapshot taken before it was added is not in
// that snapshot's membership yet, and is not removed.
func (r *Replica) noteRemoved(self paxos.NodeID) {
	ms := &r.members
	in := slices.ContainsFunc(ms.committed, func(m sm.Member) bool { return paxos.NodeID(m.ID) == self })
	first := !ms.checked
	ms.checked = true
	if in {
		ms.wasMember = true
	}
	out := !in && !ms.joining && (ms.wasMember || first)
	if out && !r.removed.Swap(true) {
		r.log.Warn().Uint64("slot", uint64(ms.slot)).Str("members", describeMembers(ms.committed)).
			Msg("this node is not in the committed membership (removed): it no longer votes nor receives the log; stop it and retire its data")
	} else if !out {
		r.removed.Store(false)
	}
}

// Removed reports whether this node knows itself outside the committed
// membership (noteRemoved): kvnode's /status shows it as "removed".
func (r *Replica) Removed() bool { return r.removed.Load() }

// refreshPeers makes every peer table follow the book (consensus loop):
// the side channel's peers, the senders the authenticator admits, the
// nodes paxos accepts messages from.
func (r *Replica) refreshPeers() {
	r.refreshBook(&r.cfg)
	book := r.book.Load()
	ids := make([]paxos.NodeID, 0, len(book.byID))
	side := make(map[paxos.NodeID]string, len(book.byID))
	for id, p := range book.byID {
		ids = append(ids, id)
		if id != r.cfg.ID {
			side[id] = p.ConsensusAddr.String()
		}
		if r.node != nil {
			r.node.AddKnown(id)
		}
	}
	slices.Sort(ids)
	if r.cfg.Auth != nil {
		if err := r.cfg.Auth.setSenders(ids); err != nil {
			r.log.Error().Err(err).Msg("the membership names a node the authenticator cannot admit")
		}
	}
	if r.side != nil {
		r.side.setPeers(side)
	}
}

// noteConfChanges follows the ConfChange entries of a Ready (consensus
// loop, after the Ready's durable part and before its messages go out):
// an accepted change's membership joins the book at once, a committed one
// becomes the committed membership. A pending membership whose slot the
// commit index passes without committing it (another value was chosen
// there) is dropped.
func (r *Replica) noteConfChanges(rd *paxos.Ready) {
	ms := &r.members
	changed := false
	// A leader's own acceptances travel in OwnAccepted (persister.go).
	if rec, slot, ok := lastConfChange(allAccepted(rd), 0); ok {
		ms.pending, ms.pendingSlot, changed = rec, slot, true
	}
	for i := range rd.Committed {
		e := &rd.Committed[i]
		if e.Type != paxos.EntryConfChange {
			continue
		}
		rec, ok := confRecord(e)
		if !ok {
			continue
		}
		if ms.committed != nil && !slices.Equal(ms.committed, rec) {
			ms.previous = ms.committed
		}
		ms.committed, ms.slot, ms.record, ms.joining = rec, e.Slot, true, false
		ms.changes++
		// A new slice each time: the published view shares the old one.
		recent := ms.recent[max(0, len(ms.recent)+1-recentChangesMax):]
		ms.recent = append(slices.Clip(recent), committedChange{seq: ms.changes, members: rec})
		changed = true
		r.log.Info().Uint64("slot", uint64(e.Slot)).Str("members", describeMembers(rec)).Msg("membership changed")
	}
	if k := len(rd.Committed); k > 0 && ms.pending != nil && rd.Committed[k-1].Slot >= ms.pendingSlot {
		ms.pending, changed = nil, true
	}
	if changed {
		r.refreshPeers()
	}
}

// recoverPendingMembership puts the last ConfChange among the entries a
// restarted node recovered from its acceptor log (accepted above its
// applied slot) in the book as pending, as noteConfChanges did when it
// accepted it. Without it a node killed before its state machine flushed
// the change came back knowing only the older membership, refused every
// packet of a member added since as from an unknown sender, and, when
// that member led, never caught up (e2e TestGrowShrinkUnderLeaderKills,
// node 4 leading). A change that was not chosen is dropped when the
// commit index passes its slot, as before (New, before the node exists).
func (r *Replica) recoverPendingMembership(accepted []paxos.Entry) {
	if testingNoRecoverPendingMembership {
		return
	}
	if rec, slot, ok := lastConfChange(accepted, r.members.slot); ok {
		r.members.pending, r.members.pendingSlot = rec, slot
		r.refreshBook(&r.cfg)
		r.log.Info().Uint64("slot", uint64(slot)).Str("members", describeMembers(rec)).
			Msg("a membership change recovered from the acceptor log is pending until its slot commits")
	}
}

// lastConfChange returns the membership of the last well-formed
// ConfChange in entries (the last in their order, which is the order they
// were accepted in) at a slot above above, and its slot; ok is false when
// there is none.
func lastConfChange(entries []paxos.Entry, above paxos.Slot) (rec []sm.Member, slot paxos.Slot, ok bool) {
	for i := len(entries) - 1; i >= 0; i-- {
		e := &entries[i]
		if e.Type != paxos.EntryConfChange || e.Slot <= above {
			continue
		}
		if rec, ok := confRecord(e); ok {
			return rec, e.Slot, true
		}
	}
	return nil, 0, false
}

// adoptMembership makes a record read from an installed snapshot the
// committed membership (consensus loop).
func (r *Replica) adoptMembership(rec sm.Membership) {
	ms := &r.members
	if ms.record && paxos.Slot(rec.Slot) <= ms.slot && !ms.joining {
		return
	}
	if ms.committed != nil && !slices.Equal(ms.committed, rec.Members) {
		ms.previous = ms.committed
	}
	ms.committed, ms.slot, ms.record, ms.joining, ms.pending = rec.Members, paxos.Slot(rec.Slot), true, false, nil
	r.log.Info().Uint64("slot", rec.Slot).Str("members", describeMembers(rec.Members)).Msg("membership from the installed snapshot")
	r.refreshPeers()
}

// membershipInstalled runs on the apply loop after a snapshot was swapped
// in: the snapshot's membership record waits in installedMembers for the
// consensus loop (adoptInstalled; the apply loop never blocks on it).
func (r *Replica) membershipInstalled() {
	rec, ok, err := r.sm.Membership()
	if err != nil {
		r.log.Warn().Err(err).Msg("reading the membership of the installed snapshot")
	}
	if ok {
		r.installedMembers.Store(&rec)
	}
}

// adoptInstalled adopts a record membershipInstalled left (consensus loop,
// before every input).
func (r *Replica) adoptInstalled() {
	if rec := r.installedMembers.Swap(nil); rec != nil {
		r.adoptMembership(*rec)
	}
}

// confRecord decodes the membership record a ConfChange entry carries
// (ok false for a change without one, or a malformed one).
func confRecord(e *paxos.Entry) ([]sm.Member, bool) {
	if len(e.Cmds) != 1 {
		return nil, false
	}
	cc, err := paxos.DecodeConfChange(e.Cmds[0])
	if err != nil || len(cc.Context) == 0 {
		return nil, false
	}
	rec, err := sm.DecodeMembership(cc.Context)
	return rec, err == nil
}

// applyConfChange applies a committed ConfChange entry to the state
// machine (apply loop): its membership record with the slot, or, for a
// change that carries no usable record, the slot alone.
func (r *Replica) applyConfChange(e *paxos.Entry) error {
	if len(e.Cmds) == 1 {
		if cc, err := paxos.DecodeConfChange(e.Cmds[0]); err == nil && len(cc.Context) > 0 {
			err := r.sm.ApplyMembership(uint64(e.Slot), cc.Context)
			if err == nil || !errors.Is(err, sm.ErrBadMembership) {
				return err
			}
			r.log.Error().Err(err).Uint64("slot", uint64(e.Slot)).Msg("a membership change carries a malformed record; applying the slot without it")
		}
	}
	_, err := r.sm.Apply(uint64(e.Slot), nil)
	return err
}

// membershipDiff describes how configured differs from committed ("" when
// they agree).
func membershipDiff(configured, committed []sm.Member) string {
	var parts []string
	for _, c := range committed {
		i := slices.IndexFunc(configured, func(x sm.Member) bool { return x.ID == c.ID })
		switch {
		case i < 0:
			parts = append(parts, fmt.Sprintf("+%d (not in the config)", c.ID))
		case configured[i].ConsensusAddr != c.ConsensusAddr || configured[i].ClientAddr != c.ClientAddr:
			parts = append(parts, fmt.Sprintf("%d at %s/%s (config: %s/%s)", c.ID, c.ConsensusAddr, c.ClientAddr,
				configured[i].ConsensusAddr, configured[i].ClientAddr))
		}
	}
	for _, c := range configured {
		if !slices.ContainsFunc(committed, func(x sm.Member) bool { return x.ID == c.ID }) {
			parts = append(parts, fmt.Sprintf("-%d (configured, not a member)", c.ID))
		}
	}
	return strings.Join(parts, ", ")
}

func describeMembers(ms []sm.Member) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprint(m.ID)
		if m.Learner {
			parts[i] += "(learner)"
		}
	}
	return strings.Join(parts, " ")
}

func cmpID(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// bookIDs lists the address book's members.
func (r *Replica) bookIDs() []paxos.NodeID {
	book := r.book.Load()
	ids := make([]paxos.NodeID, 0, len(book.byID))
	for id := range book.byID {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// learnContact hands the consensus loop a sender a joining node does not
// know, with the address its authenticated packet came from (receive
// loop; never blocks: a full control queue drops it, and the sender's
// next packet tries again).
func (r *Replica) learnContact(id paxos.NodeID, addr netip.AddrPort) {
	if testingNoLearnContacts || !addr.IsValid() {
		return
	}
	select {
	case r.controlC <- func() { r.addContact(id, addr) }:
	default:
	}
}

// addContact puts a learned contact in a joining node's book (consensus
// loop). Without it, a joiner whose config listed only members that do not
// lead refused every packet of the leader as from an unknown sender and
// never caught up (an outside tester: a learner at commit 0 for as long
// as node 5 led, every promotion refused). Only with a cluster secret:
// the packet that teaches the address is authenticated (Auth.openStranger).
// The address is the packet's source; the sender's later packets from
// elsewhere replace it (the receive loop, for learned contacts only), so
// a member's packet replayed from another address misleads the joiner
// only until the member's next one, and the membership record, once it
// arrives, replaces the lot.
func (r *Replica) addContact(id paxos.NodeID, addr netip.AddrPort) {
	ms := &r.members
	if !ms.joining || id == r.cfg.ID {
		return
	}
	if p, ok := r.peer(id); ok && p.ConsensusAddr == addr {
		return
	}
	if ms.learned == nil {
		ms.learned = make(map[paxos.NodeID]Peer)
	}
	ms.learned[id] = Peer{ID: id, ConsensusAddr: addr}
	r.learnedMask.Or(1 << id)
	r.log.Info().Uint64("node", uint64(id)).Str("addr", addr.String()).
		Msg("joining: learned a member from its authenticated packets (not in this node's [[peers]])")
	r.refreshPeers()
}
