package replica

import (
	"time"

	"synod/paxos"
)

// Accept admission: a full acceptor log never stalls an acceptor.
//
// An acceptance must be durable before it is answered, so a Ready whose
// acceptances do not fit in the acceptor log stalls: the consensus loop
// takes no input until the log has room (consensus.go). A follower whose
// log fills with entries it cannot commit yet (a laggard accepting a
// leader's new slots while it fetches a snapshot, or one holding entries
// of an older ballot) would then never get room: its commit index and its
// snapshot install both need input the stall refuses (the install waited
// behind errInstallLater for ever).
//
// So an inbound Accept (or catch-up, cut to the prefix that fits) is
// admitted to paxos only when the log has room for every entry stepping it
// would store (storedBytes), on top of what the accepts admitted since the
// last persisted Ready will take, and still keeps logReservePercent of the
// log free (limits.go: the room a node needs to lead); otherwise it is
// dropped before paxos sees it. A dropped message is a lost message, which Paxos tolerates by
// construction: nothing was promised, accepted or answered for it, so no
// durable state and no reply depends on it. The leader resends what the
// node lacks (catch-up, or a snapshot offer once it compacted past), and
// meanwhile the node keeps taking heartbeats (its commit index advances
// over what it holds), promises to a new leader (the promise is the log's
// metadata, not a record, and needs no ring space), and installs
// snapshots, after which compaction truncates the log. A Ready can still
// stall (a leader's own entries, a drop budget overshoot), and the stall
// path stays as it was.

// acceptEntryOverheadBytes over-estimates the ring space an entry takes
// beyond its commands' bytes: the pmem record header (56) and alignment
// (up to 63), and the entry's encoding (slot, ballot, type, count: 29).
// TestAcceptBytesOverEstimates holds it to that.
const acceptEntryOverheadBytes = 160

// acceptCmdOverheadBytes over-estimates the encoding of one command's
// length within an entry (4).
const acceptCmdOverheadBytes = 8

// acceptAdmission is the consensus loop's admission bookkeeping.
type acceptAdmission struct {
	// pendingBytes estimates the ring space of the accepts admitted
	// since the last Ready was persisted (they sit in paxos, not yet in
	// the log's usage).
	pendingBytes int64
}

// entryRingBytes over-estimates the ring space one entry takes.
func entryRingBytes(e *paxos.Entry) int64 {
	n := int64(acceptEntryOverheadBytes)
	for _, c := range e.Cmds {
		n += int64(len(c)) + acceptCmdOverheadBytes
	}
	return n
}

// storedBytes over-estimates the ring space of the entries of m that
// stepping it would store (consensus loop): none at or below the commit
// index, none the node holds already under the same ballot (a
// retransmitted Accept; a catch-up of entries the node accepted from that
// same leader, or holds under the ballot the leader holds them, which is
// how a new leader commits what its promises reported committed). Counting those would
// refuse a restarted follower the catch-ups that commit its own records,
// the only way its log empties. It also returns how many leading entries
// fit in room, and their bytes.
func (r *Replica) storedBytes(m *paxos.Message, room int64) (need int64, fit int, fitBytes int64) {
	var commit paxos.Slot
	if s := r.status.Load(); s != nil {
		commit = s.Commit
	}
	fitting := true
	for i := range m.Entries {
		e := m.Entries[i]
		if e.Slot > commit {
			held := r.node.Holds(&e)
			if m.Type == paxos.MsgCatchup {
				held = r.node.CatchupHolds(&e, m.Ballot) // as paxos handleCatchup decides
			}
			switch {
			case held:
			case r.node.HoldsValue(&e):
				need += reballotRingBytes // paxos reballot.go
			default:
				need += entryRingBytes(&e)
			}
		}
		if fitting && need <= room {
			fit, fitBytes = i+1, need
		} else {
			fitting = false
		}
	}
	return need, fit, fitBytes
}

// admitAccept reports whether inbound message m may be stepped: every
// message but an Accept or a catch-up is; those only when the acceptor log
// has room for the entries they would store after the accepts already
// admitted since the last persisted Ready (consensus loop). A catch-up's
// chosen entries are persisted as records too (paxos handleCatchup), so a
// full follower that took one stalled just as it would on an Accept: a
// node restarted with a log full of entries it did not know committed
// stalled on the first catch-up its leader sent. A catch-up that does not
// fit is cut to the entries that do (paxos stores a catch-up's entries in
// slot order from its commit index, so a prefix is a catch-up too): a
// catch-up carries up to 4 MiB, more than a small log may have free, and
// the entries taken commit, apply and are truncated, making room for the
// next. A refused message is counted as a log full event and asks for a
// snapshot (at most once per election timeout).
func (r *Replica) admitAccept(m *paxos.Message) bool {
	if (m.Type != paxos.MsgAccept && m.Type != paxos.MsgCatchup) || len(m.Entries) == 0 ||
		(m.Type == paxos.MsgCatchup && testingCatchupsSkipAdmission) {
		return true
	}
	used, capacity := r.alog.Usage()
	if capacity <= 0 {
		return true
	}
	a := &r.admit
	room := admitBytesMax(capacity) - used - a.pendingBytes
	need, fit, fitBytes := r.storedBytes(m, room)
	if need <= room {
		a.pendingBytes += need
		return true
	}
	if m.Type == paxos.MsgCatchup && fit > 0 {
		m.Entries = m.Entries[:fit]
		a.pendingBytes += fitBytes
		return true
	}
	r.metrics.LogFull.Inc()
	r.log.Debug().Int64("used", used).Int64("capacity", capacity).Int64("need", need).
		Str("type", m.Type.String()).Msg("acceptor log full: dropping an accept or catch-up")
	r.snapshotForRoom()
	return false
}

// snapshotForRoom asks for a snapshot because the log lacks room: it lets
// the log truncate below what this node applied (whatever
// LogSnapshotUsedPercent says). At most once per election timeout, as
// checkLogUsage does: a snapshot cannot free entries above the applied
// slot, so asking again at once is futile.
func (r *Replica) snapshotForRoom() {
	if now := r.cfg.Now(); now.After(r.nextUsageSnap) {
		r.nextUsageSnap = now.Add(time.Duration(r.cfg.ElectionTicks) * r.cfg.Tick)
		r.requestSnapshot()
	}
}

// admitBytesMax is how much of a log of capacity bytes admission lets
// accepts fill: all but logReservePercent, kept for the node's own
// re-proposals should it win an election (limits.go).
func admitBytesMax(capacity int64) int64 {
	return capacity - capacity*logReservePercent/100
}

// declareLogRoom tells paxos how much of the acceptor log it may fill with
// re-proposals should it campaign (paxos logroom.go; consensus loop): the
// free space after the accepts admitted since the last persisted Ready,
// less one record (leadSlackBytes). A node restarted with a log full of
// entries it does not know committed then defers its elections until a
// catch-up or a snapshot frees the log, instead of winning one and
// stalling on its own re-proposals.
func (r *Replica) declareLogRoom() {
	used, capacity := r.alog.Usage()
	if capacity <= 0 {
		r.node.SetLogRoom(-1)
		return
	}
	r.node.SetLogRoom(max(0, capacity-used-r.admit.pendingBytes-leadSlackBytes))
}

// admittedPersisted resets the admission budget once a Ready's
// acceptances are in the log (their bytes now show in its usage).
func (r *Replica) admittedPersisted() { r.admit.pendingBytes = 0 }
