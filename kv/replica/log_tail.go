package replica

import "synod/paxos"

// The catch-up tail by bytes. A follower that was down for a while (a
// restart, a pause, a partition) catches up from the leader's log if the
// log still holds every slot it missed, and by a snapshot of the whole
// state otherwise; at 10 GiB a snapshot takes minutes, the log seconds
// (kvbench's load scenario, README). So compaction keeps, below the
// snapshot, as much of the acceptor log as Config.CatchUpLogPercent of its
// capacity allows: the outage a follower survives without a snapshot is
// that share of the log divided by the write rate (etcd keeps a tail of
// entries for the same reason). The memory this costs is already in the
// node's budget, which reserves the whole log's mapping and paxos's copy
// of a full log (kvnode's [memory]).
//
// logTail knows how many log bytes were appended above a slot: it samples
// (the highest slot appended so far, the bytes appended so far) at most
// once per capacity/logTailSamplesMax bytes, into a bounded ring. The
// slots above a sample's were appended after it, so the lowest floor whose
// records fit in keep bytes is one above the oldest sample taken within
// keep bytes of the newest append; the error is one sample's spacing. It
// counts what the consensus loop appends (persistReady); the accel plane's
// early persists are not counted, so with accel on the tail may hold a
// little more than its share (never more than the log: compaction always
// drops it above logSnapshotUsedPercent, see limits.go). Consensus loop
// only.
type logTail struct {
	total   int64      // bytes appended since the node started
	maxSlot paxos.Slot // highest slot appended
	// ring holds up to logTailSamplesMax samples, oldest at head.
	ring [logTailSamplesMax]logTailSample
	head int
	n    int
}

type logTailSample struct {
	slot  paxos.Slot // the highest slot appended when it was taken
	total int64      // bytes appended when it was taken
}

// logTailSamplesMax bounds logTail's ring: with one sample per
// capacity/logTailSamplesMax bytes the ring spans the whole log, and the
// floor is found to within 1/logTailSamplesMax of the capacity.
const logTailSamplesMax = 1024

// start sets the highest slot the log may hold when the node starts
// (recovered entries and the applied slot): what was appended before is
// not counted, so the tail never keeps it (it goes at the first
// compaction past it, as without a tail).
func (t *logTail) start(slot paxos.Slot) { t.maxSlot = slot }

// appended records bytes appended to a log of capacity bytes, last being
// the highest slot among them. A sample is taken before the bytes are
// counted, so that the slots above its slot are exactly those appended
// after its total.
func (t *logTail) appended(bytes int64, last paxos.Slot, capacity int64) {
	if bytes <= 0 {
		return
	}
	if t.n == 0 || t.total-t.ring[(t.head+t.n-1)%logTailSamplesMax].total >= capacity/logTailSamplesMax {
		s := logTailSample{slot: t.maxSlot, total: t.total}
		if t.n < logTailSamplesMax {
			t.ring[(t.head+t.n)%logTailSamplesMax] = s
			t.n++
		} else {
			t.ring[t.head] = s
			t.head = (t.head + 1) % logTailSamplesMax
		}
	}
	t.total += bytes
	t.maxSlot = max(t.maxSlot, last)
}

// floor is the lowest slot whose records, and those of every slot above
// it, were appended within the last keep bytes (to within a sample's
// spacing); false when no sample is that recent.
func (t *logTail) floor(keep int64) (paxos.Slot, bool) {
	for i := range t.n {
		s := t.ring[(t.head+i)%logTailSamplesMax]
		if t.total-s.total <= keep {
			return s.slot + 1, true
		}
	}
	return 0, false
}
