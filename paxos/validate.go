package paxos

import (
	"errors"
	"fmt"
)

// RoundJumpMax bounds how far above the highest round a node has seen a
// message's ballot round may be. Rounds grow by one per election, so a
// correct peer is never near it (a node that slept through a million
// elections rejoins as a new member).
const RoundJumpMax = 1 << 20

// slotMax bounds every slot number on the wire: no real log reaches it, so
// a larger value is an impossible slot (and arithmetic on slots never wraps).
const slotMax = Slot(1) << 62

// validate checks m against what any correct peer could send. It never
// looks at protocol state beyond membership, so a message it accepts may
// still be stale (and is then ignored).
func (n *Node) validate(m *Message) error {
	switch {
	case m.Cluster != n.cfg.ClusterID:
		return fmt.Errorf("foreign cluster %d", m.Cluster)
	case m.To != n.id:
		return fmt.Errorf("addressed to node %d", m.To)
	case m.From == 0 || m.From == n.id || !n.known[m.From]:
		return fmt.Errorf("unknown sender %d", m.From)
	case m.Type == 0 || m.Type > msgTypeMax:
		return fmt.Errorf("unknown type %d", m.Type)
	case m.Ballot.Round >= 1<<62:
		return fmt.Errorf("impossible ballot %v", m.Ballot)
	case m.Ballot.Round > n.maxRound+RoundJumpMax:
		// Defence in depth against a buggy or hostile member: a round far
		// above any seen would make every node's next ballot outbid it
		// forever (and a promise of it is durable).
		return fmt.Errorf("ballot round %d jumps more than %d above the highest seen (%d)", m.Ballot.Round, RoundJumpMax, n.maxRound)
	case m.Type.fromProposer() && (m.Ballot.Round == 0 || m.Ballot.Node != m.From):
		return fmt.Errorf("ballot %v is not the sender's", m.Ballot)
	case m.Type == MsgSnapshot && !m.Ballot.IsZero() && (m.Ballot.Round == 0 || m.Ballot.Node != m.From):
		return fmt.Errorf("snapshot ballot %v is not the sender's", m.Ballot)
	case m.Slot > slotMax || m.Commit > slotMax || m.Index > slotMax || m.Last > slotMax:
		return errors.New("impossible slot")
	case len(m.Entries) > EntriesPerMessageMax:
		return fmt.Errorf("%d entries", len(m.Entries))
	}
	for i := range m.Entries {
		e := &m.Entries[i]
		if e.Slot == 0 || e.Slot > slotMax {
			return fmt.Errorf("entry at impossible slot %d", e.Slot)
		}
		if e.Type < EntryNormal || e.Type > EntryConfChange {
			return fmt.Errorf("entry type %d", e.Type)
		}
		if len(e.Cmds) > CmdsPerEntryMax {
			return fmt.Errorf("entry with %d commands", len(e.Cmds))
		}
		if i > 0 && e.Slot <= m.Entries[i-1].Slot {
			return fmt.Errorf("entries out of order at slot %d", e.Slot)
		}
	}
	if m.Joining && m.Type != MsgHeartbeatResp {
		return fmt.Errorf("joining flag on %v", m.Type)
	}
	if m.Reject {
		return nil
	}
	switch m.Type {
	case MsgAccept:
		for i := range m.Entries {
			e := &m.Entries[i]
			if i > 0 && e.Slot != m.Entries[i-1].Slot+1 {
				return fmt.Errorf("accept entries not contiguous at slot %d", e.Slot)
			}
			if e.Ballot != m.Ballot {
				return fmt.Errorf("accept entry ballot %v differs from %v", e.Ballot, m.Ballot)
			}
			if e.Slot > m.Commit+inflightSlotsMax {
				return fmt.Errorf("accept slot %d beyond commit %d + window", e.Slot, m.Commit)
			}
		}
	case MsgAccepted:
		if m.Slot == 0 || m.Index < m.Slot || m.Index-m.Slot >= EntriesPerMessageMax {
			return fmt.Errorf("accepted range [%d, %d]", m.Slot, m.Index)
		}
	case MsgPromise:
		if m.Slot == 0 || m.Index > m.Last || (m.Index >= m.Slot && m.Index-m.Slot >= EntriesPerMessageMax) {
			return fmt.Errorf("promise range [%d, %d] last %d", m.Slot, m.Index, m.Last)
		}
		for i := range m.Entries {
			e := &m.Entries[i]
			if e.Slot < m.Slot || e.Slot > m.Index {
				return fmt.Errorf("promise entry slot %d outside [%d, %d]", e.Slot, m.Slot, m.Index)
			}
			if e.Ballot.Round == 0 || m.Ballot.Less(e.Ballot) {
				return fmt.Errorf("promise entry ballot %v above promise %v", e.Ballot, m.Ballot)
			}
		}
	case MsgPrepare:
		if m.Slot == 0 {
			return errors.New("prepare from slot 0")
		}
	case MsgCatchup:
		for i := range m.Entries {
			e := &m.Entries[i]
			if i > 0 && e.Slot != m.Entries[i-1].Slot+1 {
				return fmt.Errorf("catch-up entries not contiguous at slot %d", e.Slot)
			}
			if e.Slot > m.Commit {
				return fmt.Errorf("catch-up slot %d beyond commit %d", e.Slot, m.Commit)
			}
		}
	case MsgSnapshot:
		s := m.Snapshot
		if s == nil || s.Slot > m.Commit {
			return errors.New("snapshot missing or above the sender's commit")
		}
		if err := validSnapshotMeta(s); err != nil {
			return err
		}
	}
	return nil
}

// validSnapshotMeta checks what any correct snapshot's metadata satisfies.
func validSnapshotMeta(s *SnapshotMeta) error {
	if s.Slot == 0 || s.Slot > slotMax || len(s.Members) == 0 || len(s.Members) > MembersMax {
		return fmt.Errorf("%w: snapshot at slot %d with %d members", ErrBadMessage, s.Slot, len(s.Members))
	}
	for _, id := range s.Members {
		if id == 0 {
			return fmt.Errorf("%w: snapshot names member 0", ErrBadMessage)
		}
	}
	return validLearners(s)
}
