package paxos

// Re-ballot records: a value accepted again under a higher ballot costs a
// ballot, not the value.
//
// A new leader re-proposes under its own ballot every value above its
// commit index (phase 2), and every acceptor that takes a re-proposal must
// record it under the new ballot, so that a later phase 1 finds the value
// at that ballot. Most of those values are ones the acceptors already
// hold, under the old leader's ballot: storing them again doubled the log
// space they took exactly when it was scarcest (a leader killed under a
// load of 256 KiB values left both survivors with 12 of 16 MiB of the
// same uncommitted entries, which neither could store a second time: no
// leader for the rest of the run). So an entry handed out for storing
// (Ready.Accepted, Ready.OwnAccepted) carries Held, the ballot under which
// the node already stored the same value at that slot, and the caller may
// store the new ballot alone (kv/replica: a re-ballot record of the
// acceptor log). The ring space counted for log room (logroom.go) and by
// the runtime's admission (HoldsValue) is then that of a record header.
//
// Why the base record is there when the re-ballot is read back: Held is
// set only when the entry being replaced was stored durably before this
// Ready (every entry of the log was handed out for storing when it was
// set, and a Ready is durable before the next input), or is earlier in
// the same Ready.Accepted, which the caller stores in order. A leader's
// own acceptance not yet reported durable (OwnAcceptedDurable) is not a
// base: the caller persists Ready.OwnAccepted in parallel with later
// work, so a re-ballot could reach the log before it. Nor, for an own
// entry, is an entry still waiting in Ready.Accepted (persisted apart
// from OwnAccepted).

// reballotBytes is the encoded size of a re-ballot: an entry without
// commands, and the held ballot.
const reballotBytes = entryHeaderBytes + 16

// markHeld returns e as it is to be handed out for storing: with Held set
// when the log holds the same value at e.Slot under another ballot, stored
// as the comment above requires. own: e goes to Ready.OwnAccepted. Call it
// before e replaces the log's entry.
func (n *Node) markHeld(e Entry, own bool) Entry {
	old := n.log.get(e.Slot)
	if TestingNoReballot || old == nil || old.Ballot == e.Ballot || !sameValue(old, &e) {
		return e
	}
	if TestingReballotAnyBase {
		e.Held = old.Ballot // the planted bug: whether or not it is stored
		return e
	}
	if _, unstable := n.unstable[e.Slot]; unstable {
		return e // an own acceptance not yet durable
	}
	if own {
		for i := range n.accepted {
			if n.accepted[i].Slot == e.Slot {
				return e // waiting in Ready.Accepted, persisted apart
			}
		}
	}
	e.Held = old.Ballot
	return e
}

// storeBytes is the ring space storing e (under a new ballot) takes here:
// a re-ballot's when the log holds e's value at its slot, the whole entry
// otherwise.
func (n *Node) storeBytes(e *Entry) int64 {
	if old := n.log.get(e.Slot); old != nil && sameValue(old, e) && !TestingNoReballot {
		return int64(reballotBytes + n.cfg.RecordOverheadBytes)
	}
	return int64(entryBytes(e) + n.cfg.RecordOverheadBytes)
}

// HoldsValue reports whether the node holds e's value at e's slot, under
// any ballot: storing e would then take a re-ballot record, not the value
// (the runtime's admission counts it so). A read; it may be called
// between inputs.
func (n *Node) HoldsValue(e *Entry) bool {
	old := n.log.get(e.Slot)
	_, unstable := n.unstable[e.Slot]
	return old != nil && !unstable && sameValue(old, e) && !TestingNoReballot
}
