package paxos

// acceptorLog holds the latest accepted entry per slot at or above first.
// An entry with Type 0 marks an empty slot (a hole).
//
// Invariant: len(entries) == 0 or entries[len(entries)-1].Type != 0, so the
// highest held slot is first+len(entries)-1.
type acceptorLog struct {
	first   Slot
	entries []Entry
}

// last returns the highest slot with an accepted entry, or first-1.
func (l *acceptorLog) last() Slot { return l.first + Slot(len(l.entries)) - 1 }

// get returns the entry at s, or nil when s holds nothing here.
func (l *acceptorLog) get(s Slot) *Entry {
	if s < l.first || s > l.last() {
		return nil
	}
	e := &l.entries[s-l.first]
	if e.Type == 0 {
		return nil
	}
	return e
}

// set stores e at e.Slot, which must be >= first.
func (l *acceptorLog) set(e Entry) {
	if e.Slot < l.first || e.Type == 0 {
		panicf("acceptorLog.set: slot %d below first %d or empty type %d", e.Slot, l.first, e.Type)
	}
	i := int(e.Slot - l.first)
	for len(l.entries) <= i {
		l.entries = append(l.entries, Entry{})
	}
	l.entries[i] = e
}

// truncateBelow drops every slot < s and makes s the first slot.
func (l *acceptorLog) truncateBelow(s Slot) {
	if s <= l.first {
		return
	}
	k := s - l.first
	if k >= Slot(len(l.entries)) {
		l.entries = nil
	} else {
		// Copy so the dropped prefix does not pin memory forever.
		rest := make([]Entry, len(l.entries)-int(k), cap(l.entries)-int(k))
		copy(rest, l.entries[k:])
		l.entries = rest
	}
	l.first = s
}
