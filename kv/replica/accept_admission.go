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
// So an inbound Accept is admitted to paxos only when the log has room for
// every entry it carries, on top of what the accepts admitted since the
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

// acceptBytes over-estimates the ring space m's entries take.
func acceptBytes(m *paxos.Message) int64 {
	var n int64
	for i := range m.Entries {
		n += acceptEntryOverheadBytes
		for _, c := range m.Entries[i].Cmds {
			n += int64(len(c)) + acceptCmdOverheadBytes
		}
	}
	return n
}

// admitAccept reports whether inbound message m may be stepped: every
// message but an Accept is; an Accept only when the acceptor log has room
// for its entries after the accepts already admitted since the last
// persisted Ready (consensus loop). A refused Accept is counted as a log
// full event and asks for a snapshot (at most once per election timeout).
func (r *Replica) admitAccept(m *paxos.Message) bool {
	if m.Type != paxos.MsgAccept || len(m.Entries) == 0 {
		return true
	}
	need := acceptBytes(m)
	used, capacity := r.alog.Usage()
	a := &r.admit
	if capacity <= 0 || used+a.pendingBytes+need <= admitBytesMax(capacity) {
		a.pendingBytes += need
		return true
	}
	r.metrics.LogFull.Inc()
	r.log.Debug().Int64("used", used).Int64("capacity", capacity).Int64("need", need).
		Msg("acceptor log full: dropping an accept")
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

// admittedPersisted resets the admission budget once a Ready's
// acceptances are in the log (their bytes now show in its usage).
func (r *Replica) admittedPersisted() { r.admit.pendingBytes = 0 }
