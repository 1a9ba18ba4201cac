package paxossim

import (
	"fmt"
	"slices"

	"synod/paxos"
)

// durableStore is what survives a crash of one node: exactly what the Ready
// contract made durable (the promised ballot, the latest accepted entry per
// slot) plus the application's durable state. Everything else a node holds
// is lost on crash.
type durableStore struct {
	promised paxos.Ballot
	accepted map[paxos.Slot]paxos.Entry
	// truncated is the highest slot truncate dropped: a runtime's log
	// never reads back a record at or below it (a re-ballot that lands
	// there after the truncation names a record that is gone, and is
	// never read either).
	truncated paxos.Slot

	// The application's durable copy. With appDurableEveryApply the whole
	// state machine is durable after every applied entry (like a store
	// that writes the applied index with the data); otherwise only its
	// latest snapshot is, and a restarted node re-applies from there.
	appState []byte // encoded kvApp, applied slot included
	snapMeta *paxos.SnapshotMeta
	snapData []byte
	// staged is a complete snapshot fetched from a peer and not yet
	// swapped in (transfer.go).
	staged *stagedSnap
}

func newDurableStore() *durableStore {
	return &durableStore{accepted: map[paxos.Slot]paxos.Entry{}}
}

// persist records the durable part of a Ready. Entries are deep-copied:
// the node may reuse their memory after Advance. It returns the
// re-ballots that named no stored base (resolve), and how many it stored.
func (s *durableStore) persist(rd *paxos.Ready) (bad []string, reballots int) {
	if rd.Promised != nil {
		s.promised = *rd.Promised
	}
	for _, e := range rd.Accepted {
		if !e.Held.IsZero() {
			reballots++
		}
		var why string
		if s.accepted[e.Slot], why = s.resolve(e); why != "" {
			bad = append(bad, why)
		}
	}
	return bad, reballots
}

// resolve is e as the store keeps it. An entry with Held is a re-ballot
// (paxos reballot.go): a runtime stores the new ballot alone and reads the
// value back from the record it stored under Held, so the store takes the
// value from the entry it holds at the slot, which must be that one, with
// the same value; why names a re-ballot without its base (the value is
// then the node's, so that one oracle reports it, not several).
func (s *durableStore) resolve(e paxos.Entry) (out paxos.Entry, why string) {
	if e.Held.IsZero() {
		return cloneEntry(e), ""
	}
	base, ok := s.accepted[e.Slot]
	if !ok && e.Slot <= s.truncated {
		// Truncated: never read back (durableState skips it too).
		e.Held = paxos.Ballot{}
		return cloneEntry(e), ""
	}
	if !ok || base.Ballot != e.Held || base.Type != e.Type || !sameCmds(base.Cmds, e.Cmds) {
		held := e.Held
		e.Held = paxos.Ballot{}
		return cloneEntry(e), fmt.Sprintf("slot %d: a re-ballot under %v names %v, the store holds the slot: %v, under %v, same value: %v",
			e.Slot, e.Ballot, held, ok, base.Ballot, ok && base.Type == e.Type && sameCmds(base.Cmds, e.Cmds))
	}
	out = cloneEntry(base)
	out.Ballot = e.Ballot
	return out, ""
}

func sameCmds(a, b [][]byte) bool {
	return slices.EqualFunc(a, b, func(x, y []byte) bool { return string(x) == string(y) })
}

// truncate drops accepted entries at or below slot, which a snapshot covers.
func (s *durableStore) truncate(slot paxos.Slot) {
	s.truncated = max(s.truncated, slot)
	for k := range s.accepted {
		if k <= slot {
			delete(s.accepted, k)
		}
	}
}

// saveSnapshot records an application snapshot as durable.
func (s *durableStore) saveSnapshot(meta paxos.SnapshotMeta, data []byte) {
	m := cloneMeta(meta)
	s.snapMeta = &m
	s.snapData = slices.Clone(data)
}

// durableState builds what NewNode gets on restart. applied is the slot the
// recovered application state holds.
func (s *durableStore) durableState(applied paxos.Slot) paxos.DurableState {
	st := paxos.DurableState{Promised: s.promised, Applied: applied}
	floor := paxos.Slot(0)
	if s.snapMeta != nil {
		m := cloneMeta(*s.snapMeta)
		st.Snapshot = &m
		floor = m.Slot
	}
	slots := make([]paxos.Slot, 0, len(s.accepted))
	for k := range s.accepted {
		if k > floor {
			slots = append(slots, k)
		}
	}
	slices.Sort(slots)
	for _, k := range slots {
		st.Accepted = append(st.Accepted, cloneEntry(s.accepted[k]))
	}
	return st
}

func cloneEntry(e paxos.Entry) paxos.Entry {
	c := e
	if e.Cmds != nil {
		c.Cmds = make([][]byte, len(e.Cmds))
		for i, b := range e.Cmds {
			c.Cmds[i] = slices.Clone(b)
		}
	}
	return c
}
