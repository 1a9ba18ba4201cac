package replica

import (
	"synod/paxos"
	"synod/pmem"
)

// The catch-up tail across restarts.
//
// While it runs, a node keeps a tail of committed entries below its
// snapshot so that a follower a little behind catches up from the log
// instead of by a snapshot of the whole state (log_tail.go). Before this,
// a restart lost that tail: paxos's log began above the applied slot, and
// a follower even one slot behind a restarted leader had to fetch the
// whole store (an outside run: after a whole-cluster restart under load,
// the new leader applied through 4299, the old one had noted 4291 chosen
// and held 4292-4299 under its own old ballot, which it could not commit
// from the new leader's messages: 11 s and 1.1 GB of snapshot on each
// follower before the next commit). The acceptor log still holds those
// records; recovery now gives them back to paxos as committed entries.
//
// Which records at or below the applied slot hold the value applied
// there: every record of a slot the state machine applied from this
// node's own log, since a slot is delivered only once committed and only
// after its entry was persisted, and a committed slot's entry is never
// replaced (chosen.go's argument). Not those of a slot the state came
// from a snapshot for: an install jumps over slots whose records may be
// values that were never chosen. So the tail starts above
//   - the state machine's installed slot (sm.SM.Installed: the slot of the
//     snapshot the state was last restored from),
//   - the log's truncation point,
//   - the last membership change the state applied, so that the tail
//     holds no ConfChange and the membership of the state governs every
//     slot of it (a ConfChange at slot c governs the slots above c);
// and it is the run of slots, each with a record, that ends at the
// applied slot (a hole ends it: paxos needs every slot of its log below
// the commit index).

// tailFloor is the lowest slot recovery may give paxos as committed below
// applied+1; applied+1 when none.
func tailFloor(applied, truncated, installed, membership paxos.Slot) paxos.Slot {
	if applied == 0 || testingNoRecoveredTail {
		return applied + 1
	}
	if testingTailIgnoresInstall {
		installed = 0 // the planted bug: records below an install trusted
	}
	// 2 and above: a snapshot at slot 0 is no snapshot (paxos).
	return min(max(truncated, installed+1, membership+1, 2), applied+1)
}

// splitTail splits recovered entries (in slot order, the latest record of
// each slot at or above the floor) into the tail, the run of slots ending
// at applied with no hole and no ConfChange, and those above applied.
func splitTail(recovered []paxos.Entry, applied paxos.Slot) (tail, above []paxos.Entry) {
	i := 0
	for i < len(recovered) && recovered[i].Slot <= applied {
		i++
	}
	above = recovered[i:]
	j, want := i, applied
	for j > 0 && recovered[j-1].Slot == want && recovered[j-1].Type != paxos.EntryConfChange {
		j--
		want--
	}
	return recovered[j:i], above
}

// countRecovered seeds the catch-up tail's byte count with the recovered
// records, in slot order (their order in the ring, to within the
// re-proposals of a slot), so the first compaction keeps the share of
// the log Config.CatchUpLogPercent asks for instead of dropping it all.
func (t *logTail) countRecovered(entries []paxos.Entry, from paxos.Slot, capacity int64) {
	t.start(from)
	var buf []byte
	for i := range entries {
		buf = paxos.AppendEntry(buf[:0], &entries[i])
		t.appended(pmem.RecordBytes(len(buf)), entries[i].Slot, capacity)
	}
}

// testingNoRecoveredTail (tests only) recovers no tail: paxos's log
// starts above the applied slot, as before the tail was kept.
var testingNoRecoveredTail bool

// testingTailIgnoresInstall (tests only) is a planted bug: the tail
// ignores the installed slot, so records a snapshot install jumped over
// count as committed values.
var testingTailIgnoresInstall bool
