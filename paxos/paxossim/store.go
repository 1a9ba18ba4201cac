package paxossim

import (
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
// the node may reuse their memory after Advance.
func (s *durableStore) persist(rd *paxos.Ready) {
	if rd.Promised != nil {
		s.promised = *rd.Promised
	}
	for _, e := range rd.Accepted {
		s.accepted[e.Slot] = cloneEntry(e)
	}
}

// truncate drops accepted entries at or below slot, which a snapshot covers.
func (s *durableStore) truncate(slot paxos.Slot) {
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
