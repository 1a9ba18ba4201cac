package paxos

import (
	"errors"
	"maps"
	"slices"
)

// Limits of the leader's pipeline. Units are in the names.
const (
	// inflightSlotsMax bounds the slots the leader has sent Accepts for
	// beyond its commit index (the phase 2 pipeline window).
	inflightSlotsMax = 1024
	// InflightSlotsMax is inflightSlotsMax, for callers that size what
	// a full pipeline takes.
	InflightSlotsMax = inflightSlotsMax
	// SlotCmdsMax bounds the commands batched into one slot.
	SlotCmdsMax = 256
	// SlotBytesMax bounds the command bytes batched into one slot (a single
	// larger command still gets a slot of its own, up to CmdBytesMax).
	SlotBytesMax = 256 << 10
	// ProposalQueueMax bounds commands waiting for a slot.
	ProposalQueueMax = 8192
	// ReadsPendingMax bounds ReadIndex calls waiting for a read barrier.
	ReadsPendingMax = 4096
	// catchupEntriesMax and catchupBytesMax bound the chosen entries one
	// catch-up message carries.
	catchupEntriesMax = 256
	catchupBytesMax   = 4 << 20
	// retransmitEntriesPerPeerMax bounds the Accepts resent to one peer per
	// heartbeat.
	retransmitEntriesPerPeerMax = 256
	// retransmitBackoffMax bounds the doublings of a slot's retransmission
	// interval (retransmitInterval also caps it at half an election).
	retransmitBackoffMax = 6
	// hbHistoryMax is how many heartbeat send ticks the leader remembers to
	// date a lease when a majority confirms a heartbeat.
	hbHistoryMax = 64
	// ackHistorySlots is how long (in slots behind commit) ack counts stay
	// observable through AckCount and late acks keep producing AckEvents.
	ackHistorySlots = inflightSlotsMax
)

// ErrReadsFull reports that too many ReadIndex calls wait for a barrier.
var ErrReadsFull = errors.New("paxos: too many pending reads")

// leader is the phase 2 state of the node leading under ballot.
//
// Invariant: every slot in (commit, log.last()] holds an entry accepted by
// this node under ballot; sentThrough <= log.last().
type leader struct {
	ballot      Ballot
	noopSlot    Slot // the first slot proposed under ballot after phase 1
	nextSlot    Slot // next slot for new proposals
	sentThrough Slot // Accepts broadcast for every slot <= sentThrough
	ccSlots     []Slot
	acks        map[Slot]*slotAcks

	queue    [][]byte
	ccQueued *ConfChange
	peers    map[NodeID]*peer
	// leaving holds acceptors removed by a committed ConfChange (at the
	// slot given) that have not yet reported a commit index past it: they
	// still get heartbeats and catch-up, so they learn of their removal and
	// stop campaigning, but their acks count for nothing.
	leaving    map[NodeID]*leavingPeer
	hbSeq      uint64
	hbSent     [hbHistoryMax]hbRecord
	confirmed  uint64 // highest heartbeat seq a majority acked
	leaseUntil int64  // lease valid while now < leaseUntil
	reads      []pendingRead
	barrier    bool // a read waits for the next heartbeat round

	hbElapsed    int
	checkElapsed int

	// inflightBytes is the encoded size of the entries this leader
	// accepted above its commit index (Config.InflightBytesMax).
	inflightBytes int
}

type slotAcks struct {
	from []NodeID
	// sentTick is when the Accepts for the slot last went out (first send
	// or retransmission); resends counts retransmissions. An unacked slot
	// is resent once retransmitInterval has passed since sentTick, so a
	// large entry still in flight is not sent again every heartbeat.
	sentTick int64
	resends  uint8
	// bytes is the slot's encoded entry size, counted in
	// leader.inflightBytes until the slot commits.
	bytes int
}

type peer struct {
	commit       Slot
	hbAcked      uint64
	active       bool
	lastSnapTick int64
	// catchupTick is when the last catch-up went to this peer: a
	// heartbeat answer that still shows it lagging sends the next one only
	// catchupResendTicks later (its answer, showing progress, sends the
	// next at once), so one slow acceptor is fed at the pace it answers.
	catchupTick int64
	// stuckSince is when the first catch-up went to this peer since its
	// answers last showed its commit index move or reach the leader's, or
	// since it came back from a silence, and stuckSends how many went
	// since (catchup_stuck.go).
	stuckSince int64
	stuckSends int
	// heardTick is when this peer's last answer (to a heartbeat or an
	// accept) arrived; 0 before the first.
	heardTick int64
	// answered: an answer from this peer arrived under this leadership,
	// so commit is a figure it reported (PeerProgress.Reported).
	answered bool
}

type leavingPeer struct {
	peer
	slot Slot
}

type hbRecord struct {
	seq    uint64
	tick   int64
	commit Slot // the commit index the heartbeat carried
}

type pendingRead struct {
	id    uint64
	index Slot
	seq   uint64 // heartbeat round that must be confirmed
}

// becomeLeader ends phase 1: it commits the values the promises reported
// committed from its commit index on (chosen_prefix.go), re-proposes the
// other adopted values (noops in holes) under its ballot, adds a noop of its
// own and starts phase 2.
func (n *Node) becomeLeader() {
	n.commitChosenPrefix()
	if !n.isVoter() {
		// A committed ConfChange in the prefix removed this node.
		n.becomeFollower()
		return
	}
	c := n.cand
	l := &leader{
		ballot:      c.ballot,
		acks:        map[Slot]*slotAcks{},
		peers:       map[NodeID]*peer{},
		leaving:     map[NodeID]*leavingPeer{},
		sentThrough: n.commit,
	}
	n.role = RoleLeader
	n.cand = nil
	n.lead = l
	n.leader = n.id
	n.lastLeaderTick = n.now
	n.prechecking = false
	n.syncPeers()
	for s := c.from; s <= c.maxSlot; s++ {
		e := Entry{Slot: s, Ballot: l.ballot, Type: EntryNoop}
		if v, ok := c.values[s]; ok {
			e.Type, e.Cmds = v.e.Type, v.e.Cmds
		}
		n.leaderAccept(e)
	}
	l.noopSlot = c.maxSlot + 1
	l.nextSlot = l.noopSlot + 1
	n.leaderAccept(Entry{Slot: l.noopSlot, Ballot: l.ballot, Type: EntryNoop})
	if n.role == RoleLeader {
		n.flush()
		n.broadcastHeartbeat()
	}
}

// syncPeers makes the peer table match the latest membership, voters and
// learners alike.
func (n *Node) syncPeers() {
	l := n.lead
	members := slices.Concat(n.conf.latest(), n.conf.latestLearners())
	for id, p := range l.peers {
		if !slices.Contains(members, id) {
			delete(l.peers, id)
			l.leaving[id] = &leavingPeer{peer: *p, slot: n.commit}
		}
	}
	for id := range l.leaving {
		if slices.Contains(members, id) {
			delete(l.leaving, id) // added back
		}
	}
	for _, id := range members {
		if id != n.id && l.peers[id] == nil {
			l.peers[id] = &peer{}
		}
	}
}

// leaderAccept stores e as accepted by the leader itself. The acceptance
// counts as the leader's vote only once it is durable (OwnAcceptedDurable,
// ownvote.go).
func (n *Node) leaderAccept(e Entry) {
	l := n.lead
	rec := n.markHeld(e, true)
	n.log.set(e)
	n.holdOwn(rec)
	n.noteKnown(&e)
	if e.Type == EntryConfChange {
		l.ccSlots = append(l.ccSlots, e.Slot)
	}
	a := &slotAcks{sentTick: n.now, bytes: entryBytes(&e)}
	l.acks[e.Slot] = a
	l.inflightBytes += a.bytes
	if TestingVoteBeforePersist && slices.Contains(n.conf.at(e.Slot), n.id) {
		n.countAck(e.Slot, a, n.id) // planted: counted before it is durable
	}
}

// countAck records that from accepted slot under the leader's ballot.
func (n *Node) countAck(s Slot, a *slotAcks, from NodeID) {
	l := n.lead
	a.from = append(a.from, from)
	q := quorum(len(n.conf.at(s)))
	n.ackEvents = append(n.ackEvents, AckEvent{Slot: s, Ballot: l.ballot, From: from, Count: len(a.from),
		Committed: len(a.from) == q && s > n.commit})
	n.leaderTryCommit()
}

// leaderTryCommit advances the commit index over every slot a majority of
// its membership accepted under the leader's ballot.
func (n *Node) leaderTryCommit() {
	for n.role == RoleLeader {
		s := n.commit + 1
		a := n.lead.acks[s]
		if a == nil || len(a.from) < quorum(len(n.conf.at(s))) {
			return
		}
		n.advanceCommit()
	}
}

// leaderCommitted runs on the leader after slot s (holding e) committed.
func (n *Node) leaderCommitted(s Slot, e *Entry) {
	l := n.lead
	if a := l.acks[s]; a != nil {
		l.inflightBytes -= a.bytes
		a.bytes = 0
	}
	if old := s - min(s, ackHistorySlots); old > 0 {
		delete(l.acks, old)
	}
	if len(l.ccSlots) > 0 && l.ccSlots[0] == s {
		l.ccSlots = l.ccSlots[1:]
		n.syncPeers()
		if !n.isVoter() {
			// Removed: hand over by stepping down; the remaining members
			// elect a leader among themselves.
			n.becomeFollower()
			return
		}
	}
	if s == l.noopSlot {
		n.releaseReads()
	}
}

func (l *leader) enqueue(cmds [][]byte) error {
	if len(l.queue)+len(cmds) > ProposalQueueMax {
		return ErrProposalsFull
	}
	for _, c := range cmds {
		if len(c) > CmdBytesMax {
			return errors.New("paxos: command larger than CmdBytesMax")
		}
	}
	l.queue = append(l.queue, cmds...)
	return nil
}

func (l *leader) enqueueConfChange(n *Node, cc ConfChange) error {
	if l.confChangeInFlight() {
		return ErrConfChangeBusy
	}
	if err := n.checkConfChange(cc); err != nil {
		return err
	}
	l.ccQueued = &cc
	return nil
}

// confChangeInFlight reports whether a membership change is queued or
// proposed and not yet committed: one at a time.
func (l *leader) confChangeInFlight() bool {
	return l.ccQueued != nil || len(l.ccSlots) > 0
}

// canAssign reports whether the leader may fill a new slot now.
func (n *Node) canAssign() bool {
	l := n.lead
	return (len(l.ccSlots) == 0 || TestingAssignPastConfChange) && l.nextSlot <= n.commit+inflightSlotsMax && !n.windowBytesFull() && !n.ownUnstableFull() && !n.transferring()
}

// partialSlotOpen reports whether the leader may assign a slot that is
// not full now: fewer than Config.PipelineSlotsMax slots above its commit
// index (always without one).
func (n *Node) partialSlotOpen() bool {
	return n.cfg.PipelineSlotsMax == 0 || n.lead.nextSlot <= n.commit+Slot(n.cfg.PipelineSlotsMax)
}

// windowBytesFull reports whether the leader's entries above its commit
// index reached Config.InflightBytesMax.
func (n *Node) windowBytesFull() bool {
	return n.cfg.InflightBytesMax > 0 && n.lead.inflightBytes >= n.cfg.InflightBytesMax
}

// InflightBytes is the encoded size of the entries the leader holds above
// its commit index (0 on a node that does not lead).
func (n *Node) InflightBytes() int {
	if n.role != RoleLeader {
		return 0
	}
	return n.lead.inflightBytes
}

// flush turns queued proposals into slots and sends the Accepts the
// pipeline window and the membership rule allow. It runs when the caller
// collects a Ready, so proposals made between two Readys share slots.
func (n *Node) flush() {
	if n.role != RoleLeader {
		return
	}
	l := n.lead
	for len(l.queue) > 0 && n.canAssign() {
		k, bytes := 0, 0
		for k < len(l.queue) && k < SlotCmdsMax {
			sz := len(l.queue[k])
			if k > 0 && bytes+sz > SlotBytesMax {
				break
			}
			bytes += sz
			k++
		}
		// The pipeline window holds back only a slot that more
		// proposals could still join; a full one gains nothing by
		// waiting.
		full := k == SlotCmdsMax || k < len(l.queue) || bytes >= SlotBytesMax
		if !full && !n.partialSlotOpen() {
			break
		}
		cmds := slices.Clone(l.queue[:k])
		l.queue = l.queue[k:]
		n.leaderAccept(Entry{Slot: l.nextSlot, Ballot: l.ballot, Type: EntryNormal, Cmds: cmds})
		l.nextSlot++
		if n.role != RoleLeader {
			return
		}
	}
	if len(l.queue) == 0 {
		l.queue = nil
	}
	if l.ccQueued != nil && n.canAssign() {
		cc := *l.ccQueued
		l.ccQueued = nil
		n.leaderAccept(Entry{Slot: l.nextSlot, Ballot: l.ballot, Type: EntryConfChange, Cmds: [][]byte{EncodeConfChange(cc)}})
		l.nextSlot++
		if n.role != RoleLeader {
			return
		}
	}
	limit := min(n.log.last(), n.commit+inflightSlotsMax)
	if len(l.ccSlots) > 0 && !TestingAssignPastConfChange {
		limit = min(limit, l.ccSlots[0])
	}
	if l.sentThrough < limit {
		from := l.sentThrough + 1
		members := n.replicasAt(from)
		for lo := from; lo <= limit; {
			ents := n.logRange(lo, limit)
			for _, id := range members {
				if id != n.id {
					n.send(Message{Type: MsgAccept, To: id, Ballot: l.ballot, Commit: n.commit, Entries: ents})
				}
			}
			lo += Slot(len(ents))
		}
		l.sentThrough = limit
	}
	if l.barrier {
		n.broadcastHeartbeat()
	}
	n.checkTransfer()
}

// logRange copies the entries from lo on, through hi at most, as many as one
// message may carry (at least one). They must all be held.
func (n *Node) logRange(lo, hi Slot) []Entry {
	return n.logRangeBytes(lo, hi, messageEntryBytesMax)
}

// logRangeBytes is logRange with at most bytesMax encoded entry bytes
// (one entry at least).
func (n *Node) logRangeBytes(lo, hi Slot, bytesMax int) []Entry {
	hi = min(hi, lo+EntriesPerMessageMax-1)
	out := make([]Entry, 0, hi-lo+1)
	size := 0
	for s := lo; s <= hi; s++ {
		e := n.log.get(s)
		if e == nil {
			n.invariantf("leader holds no entry at slot %d in [%d, %d]", s, lo, hi)
		}
		if size += entryBytes(e); size > bytesMax && len(out) > 0 {
			break
		}
		out = append(out, *e)
	}
	return out
}

// tickLeader runs the leader's timers: k ticks passed, of which the
// check-quorum window counts liveness (Elapse says why they differ).
func (n *Node) tickLeader(k, liveness int) {
	l := n.lead
	l.hbElapsed += k
	if l.hbElapsed >= n.cfg.HeartbeatTicks {
		l.hbElapsed = 0
		n.broadcastHeartbeat()
		n.retransmit()
	}
	l.checkElapsed += liveness
	if l.checkElapsed >= n.cfg.ElectionTicks {
		l.checkElapsed = 0
		members := n.conf.latest()
		active := 0
		for _, id := range members {
			if id == n.id {
				active++
			} else if p := l.peers[id]; p != nil && p.active {
				active++
			}
		}
		for _, p := range l.peers {
			p.active = false
		}
		if active < quorum(len(members)) {
			// Check quorum: a leader cut off from a majority steps down,
			// so its clients look for the leader the majority elects.
			n.becomeFollower()
		}
	}
}

// broadcastHeartbeat starts a heartbeat round: it carries the commit index,
// renews the acceptors' leases and confirms pending reads.
func (n *Node) broadcastHeartbeat() {
	l := n.lead
	l.barrier = false
	l.hbSeq++
	l.hbSent[l.hbSeq%hbHistoryMax] = hbRecord{seq: l.hbSeq, tick: n.now, commit: n.commit}
	if n.cfg.LeaseTicks > 0 {
		n.leaseHolder = n.id
		n.leaseUntil = n.now + int64(n.cfg.LeaseTicks)
	}
	for _, id := range slices.Concat(n.conf.latest(), n.conf.latestLearners()) {
		if id != n.id {
			n.send(Message{Type: MsgHeartbeat, To: id, Ballot: l.ballot, Commit: n.commit, Context: l.hbSeq})
		}
	}
	for _, id := range slices.Sorted(maps.Keys(l.leaving)) {
		n.send(Message{Type: MsgHeartbeat, To: id, Ballot: l.ballot, Commit: n.commit, Context: l.hbSeq})
	}
	n.confirmHeartbeats()
}

// retransmit resends Accepts for in-flight slots a peer has not acked.
func (n *Node) retransmit() {
	l := n.lead
	lo := n.commit + 1
	if lo > l.sentThrough {
		return
	}
	due := func(a *slotAcks) bool { return a == nil || n.now-a.sentTick >= n.retransmitInterval(a) }
	members := n.replicasAt(lo)
	for _, id := range members {
		if id == n.id {
			continue
		}
		budget := retransmitEntriesPerPeerMax
		var run []Entry
		runBytes := 0
		flushRun := func() {
			if len(run) > 0 {
				n.send(Message{Type: MsgAccept, To: id, Ballot: l.ballot, Commit: n.commit, Entries: run})
				run, runBytes = nil, 0
			}
		}
		for s := lo; s <= l.sentThrough && budget > 0; s++ {
			a := l.acks[s]
			if a != nil && (slices.Contains(a.from, id) || !due(a)) {
				flushRun()
				continue
			}
			e := n.log.get(s)
			if runBytes+entryBytes(e) > messageEntryBytesMax {
				flushRun()
			}
			run = append(run, *e)
			runBytes += entryBytes(e)
			budget--
		}
		flushRun()
	}
	for s := lo; s <= l.sentThrough; s++ {
		if a := l.acks[s]; a != nil && due(a) {
			a.sentTick = n.now
			a.resends = min(a.resends+1, retransmitBackoffMax)
		}
	}
}

// retransmitInterval is how long an unacked slot waits before its Accepts
// go out again: a heartbeat period, doubling with each resend up to half an
// election timeout.
func (n *Node) retransmitInterval(a *slotAcks) int64 {
	return min(int64(n.cfg.HeartbeatTicks)<<a.resends, int64(max(n.cfg.ElectionTicks/2, n.cfg.HeartbeatTicks)))
}

func (n *Node) handleAccepted(m *Message) {
	if n.role != RoleLeader {
		return
	}
	l := n.lead
	if m.Reject {
		if l.ballot.Less(m.Ballot) {
			n.becomeFollower()
		}
		return
	}
	p := l.peers[m.From]
	if m.Ballot != l.ballot || p == nil {
		return
	}
	n.heardFrom(p)
	p.commit = max(p.commit, m.Commit)
	for s := m.Slot; s <= m.Index && n.role == RoleLeader; s++ {
		a := l.acks[s]
		if a == nil || slices.Contains(a.from, m.From) || !n.countsFor(s, m.From) {
			continue
		}
		n.countAck(s, a, m.From)
	}
}

func (n *Node) handleHeartbeatResp(m *Message) {
	if n.role != RoleLeader {
		return
	}
	l := n.lead
	if m.Reject {
		if l.ballot.Less(m.Ballot) {
			n.becomeFollower()
		}
		return
	}
	if m.Ballot != l.ballot {
		return
	}
	p := l.peers[m.From]
	lp := l.leaving[m.From]
	if lp != nil {
		if m.Commit >= lp.slot {
			delete(l.leaving, m.From)
			return
		}
		p = &lp.peer
	}
	if p == nil {
		return
	}
	n.heardFrom(p)
	prev := p.commit
	p.commit = m.Commit
	if m.Commit != prev || m.Commit >= n.commit {
		p.stuckSince, p.stuckSends = 0, 0 // moved (or restarted), or caught up
	}
	if lp == nil && m.Context > p.hbAcked && m.Context <= l.hbSeq {
		p.hbAcked = m.Context
		n.confirmHeartbeats()
	}
	// Catch up an acceptor that could not reach the commit index a
	// heartbeat told it (it lacks the values), and keep going while a
	// catch-up answer shows progress.
	lagging := false
	if m.Context != 0 {
		r := l.hbSent[m.Context%hbHistoryMax]
		lagging = r.seq == m.Context && m.Commit < r.commit &&
			(p.catchupTick == 0 || m.Commit > prev || n.now-p.catchupTick >= n.catchupResendTicks())
	} else {
		lagging = m.Commit > prev && m.Commit < n.commit
	}
	if lagging {
		p.catchupTick = n.now
		n.sendCatchup(m.From, p)
	}
}

// sendCatchup sends a lagging acceptor the chosen entries it misses, or the
// snapshot when they were compacted away.
func (n *Node) sendCatchup(to NodeID, p *peer) {
	l := n.lead
	if n.catchupStuck(to, p) {
		return
	}
	from := p.commit + 1
	if from < n.log.first || n.joinerNeedsSnapshot(to, p) {
		snap := n.offerableSnapshot() // join.go
		if snap == nil || (p.lastSnapTick != 0 && n.now-p.lastSnapTick < int64(n.cfg.ElectionTicks)) {
			return
		}
		p.lastSnapTick = n.now
		n.send(Message{Type: MsgSnapshot, To: to, Ballot: l.ballot, Commit: n.commit, Snapshot: snap})
		return
	}
	hi := min(n.commit, from+catchupEntriesMax-1)
	n.send(Message{Type: MsgCatchup, To: to, Ballot: l.ballot, Commit: n.commit, Entries: n.logRangeBytes(from, hi, catchupBytesMax)})
}

// catchupResendTicks is how long a catch-up may go unanswered before a
// heartbeat answer that shows the peer still lagging sends another: two
// heartbeat periods, or a quarter of an election timeout if longer.
func (n *Node) catchupResendTicks() int64 {
	return int64(max(2*n.cfg.HeartbeatTicks, n.cfg.ElectionTicks/4))
}

// confirmHeartbeats finds the newest heartbeat round a majority acked; it
// extends the lease from that round's send tick and releases reads.
func (n *Node) confirmHeartbeats() {
	l := n.lead
	members := n.conf.latest()
	seqs := make([]uint64, 0, len(members))
	for _, id := range members {
		if id == n.id {
			seqs = append(seqs, l.hbSeq)
		} else if p := l.peers[id]; p != nil {
			seqs = append(seqs, p.hbAcked)
		}
	}
	q := quorum(len(members))
	if q < 1 || len(seqs) < q {
		return
	}
	slices.Sort(seqs)
	slices.Reverse(seqs)
	c := seqs[q-1]
	if c <= l.confirmed {
		return
	}
	l.confirmed = c
	if n.cfg.LeaseTicks > 0 {
		if r := l.hbSent[c%hbHistoryMax]; r.seq == c {
			// Every acceptor that acked round c granted the lease on
			// receipt, no earlier than r.tick; DriftTicks covers clocks
			// that run at different rates over the lease.
			from, drift := r.tick, int64(n.cfg.DriftTicks)
			if TestingLeaseFromAckArrival {
				from = n.now // planted: dated from the ack's arrival
			}
			if TestingLeaseIgnoresDrift {
				drift = 0 // planted: the drift bound is not subtracted
			}
			l.leaseUntil = max(l.leaseUntil, from+int64(n.cfg.LeaseTicks)-drift)
		}
	}
	n.releaseReads()
}

// ownCommitted reports whether the leader's first slot under its own ballot
// is committed: only then does its commit index cover every write a previous
// leader may have acknowledged.
func (n *Node) ownCommitted() bool { return n.commit >= n.lead.noopSlot }

func (n *Node) leaseValid() bool {
	return n.role == RoleLeader && n.cfg.LeaseTicks > 0 && n.now < n.lead.leaseUntil
}

func (n *Node) readIndex(id uint64) error {
	l := n.lead
	if n.ownCommitted() && n.leaseValid() {
		n.readStates = append(n.readStates, ReadState{ID: id, Index: n.commit, ByLease: true})
		return nil
	}
	if len(l.reads) >= ReadsPendingMax {
		return ErrReadsFull
	}
	l.reads = append(l.reads, pendingRead{id: id, index: n.commit, seq: l.hbSeq + 1})
	l.barrier = true
	return nil
}

// releaseReads answers the reads whose barrier round is confirmed, once the
// leader's own first entry is committed.
func (n *Node) releaseReads() {
	l := n.lead
	if len(l.reads) == 0 || !n.ownCommitted() {
		return
	}
	k := 0
	for _, r := range l.reads {
		if r.seq <= l.confirmed {
			n.readStates = append(n.readStates, ReadState{ID: r.id, Index: max(r.index, l.noopSlot)})
		} else {
			l.reads[k] = r
			k++
		}
	}
	l.reads = l.reads[:k]
}
