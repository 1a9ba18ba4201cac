package replica

import (
	"time"

	"synod/paxos"
)

// Chosen-through notes: what a restart knows committed.
//
// A node knows nothing committed beyond what its state machine applied
// when it restarts, and a leader's apply can lag its commit index by most
// of its acceptor log: every record between the two would count as
// uncommitted, which a leader re-proposes first and which a full log
// cannot take (paxos logroom.go, kv/README "A full acceptor log"), and
// which every promise of the elections after a whole-cluster restart
// carries: with 14,000 such records per node, three restarted nodes
// dueled through twenty ballot rounds for 3.4 s before one led. So the
// consensus loop notes in the log's header, at most once per
// chosenNoteEvery (100 ms), the slot through which paxos has delivered
// committed entries; a restart commits the records it holds through it
// (paxos DurableState.Chosen) and applies them at once. A note is one
// header line persisted (one msync of a page, 135-254 us, in the msync
// mode): at most ten a second cost the loop a fraction of a percent.
//
// Why every record at or below the note holds a chosen value: a slot is
// delivered only once committed, and only after the Ready that stored its
// entry was persisted (an acceptor's entries before its answers, a
// leader's own before it delivers them, paxos ownvote.go); a committed
// slot's entry is never replaced (paxos takes no accept or catch-up at or
// below its commit index). The one exception is a snapshot install,
// after which the log may still hold older, unchosen records of slots
// below the snapshot until it truncates; they lie at or below the
// install's slot, which the state machine's applied slot reaches once the
// install is durable, and recovery reads only records above the applied
// slot. So no note is taken while an install is not yet durable in the
// store (installSlot above storeDurable).

// chosenLog is an acceptor log that can note a chosen-through slot in its
// header (PMemLog); other logs simply lack the notes.
type chosenLog interface {
	NoteChosen(slot paxos.Slot) error
	Chosen() paxos.Slot
}

// chosenNotes is the consensus loop's bookkeeping of the notes.
type chosenNotes struct {
	next         time.Time  // no note before
	noted        paxos.Slot // the last slot noted
	installSlot  paxos.Slot // the last snapshot installed in this process
	storeDurable paxos.Slot // the highest slot a compaction found durable in the store
}

// noteChosen takes a note when it is due (consensus loop, after a Ready
// was persisted and delivered).
func (r *Replica) noteChosen() {
	cl, ok := r.alog.(chosenLog)
	cn := &r.chosen
	if !ok || TestingNoChosenNotes {
		return
	}
	now := r.cfg.Now()
	if now.Before(cn.next) || cn.installSlot > cn.storeDurable {
		return
	}
	st := r.node.Status()
	slot := st.Applied // delivered (Advance), hence durable in the log
	if TestingChosenNoteLastSlot {
		slot = st.LastSlot // the planted bug: what it holds, chosen or not
	}
	if slot <= cn.noted {
		return
	}
	cn.next = now.Add(chosenNoteEvery)
	if err := cl.NoteChosen(slot); err != nil {
		r.log.Warn().Err(err).Uint64("slot", uint64(slot)).Msg("noting the chosen-through slot in the acceptor log")
		return
	}
	cn.noted = slot
}
