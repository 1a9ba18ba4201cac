package paxos

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// ErrBadConfChange reports a membership change that cannot apply (adding a
// member, removing a non-member, removing the last member, too many members).
var ErrBadConfChange = errors.New("paxos: invalid membership change")

// confChangeBytes is the encoded size of a ConfChange: version, type, node.
const confChangeBytes = 1 + 1 + 8

// EncodeConfChange returns the encoding of cc carried in an EntryConfChange.
func EncodeConfChange(cc ConfChange) []byte {
	b := make([]byte, 0, confChangeBytes)
	b = append(b, codecVersion, byte(cc.Type))
	return binary.LittleEndian.AppendUint64(b, uint64(cc.Node))
}

// DecodeConfChange decodes what EncodeConfChange produced.
func DecodeConfChange(b []byte) (ConfChange, error) {
	if len(b) != confChangeBytes {
		return ConfChange{}, fmt.Errorf("%w: conf change of %d bytes, want %d", errDecode, len(b), confChangeBytes)
	}
	if b[0] != codecVersion {
		return ConfChange{}, fmt.Errorf("%w: conf change version %d", errDecode, b[0])
	}
	cc := ConfChange{Type: ConfChangeType(b[1]), Node: NodeID(binary.LittleEndian.Uint64(b[2:]))}
	if cc.Type != ConfAddNode && cc.Type != ConfRemoveNode {
		return ConfChange{}, fmt.Errorf("%w: conf change type %d", errDecode, cc.Type)
	}
	if cc.Node == 0 {
		return ConfChange{}, fmt.Errorf("%w: conf change names node 0", errDecode)
	}
	return cc, nil
}

// entryConfChange decodes the change an EntryConfChange carries; ok is false
// for any other entry or a malformed one (which then changes nothing: every
// replica decodes the same bytes the same way, so they still agree).
func entryConfChange(e *Entry) (ConfChange, bool) {
	if e.Type != EntryConfChange || len(e.Cmds) != 1 {
		return ConfChange{}, false
	}
	cc, err := DecodeConfChange(e.Cmds[0])
	return cc, err == nil
}

// applyConfChange returns the membership after cc, or an error when cc does
// not apply to members. members is not modified.
func applyConfChange(members []NodeID, cc ConfChange) ([]NodeID, error) {
	has := slices.Contains(members, cc.Node)
	switch cc.Type {
	case ConfAddNode:
		if has {
			return nil, fmt.Errorf("%w: node %d is already a member", ErrBadConfChange, cc.Node)
		}
		if len(members) >= MembersMax {
			return nil, fmt.Errorf("%w: %d members is the limit", ErrBadConfChange, MembersMax)
		}
		out := append(slices.Clone(members), cc.Node)
		slices.Sort(out)
		return out, nil
	case ConfRemoveNode:
		if !has {
			return nil, fmt.Errorf("%w: node %d is not a member", ErrBadConfChange, cc.Node)
		}
		if len(members) == 1 {
			return nil, fmt.Errorf("%w: cannot remove the last member", ErrBadConfChange)
		}
		out := slices.DeleteFunc(slices.Clone(members), func(id NodeID) bool { return id == cc.Node })
		return out, nil
	}
	return nil, fmt.Errorf("%w: type %d", ErrBadConfChange, cc.Type)
}

// confEpoch is a membership in force for every slot >= from (until the next
// epoch).
type confEpoch struct {
	from    Slot
	members []NodeID // sorted
}

// confHistory is the sequence of memberships decided by committed
// ConfChange entries. Invariant: epochs are in increasing from order and
// epochs[0].from <= every slot the node still reasons about.
type confHistory struct {
	epochs []confEpoch
}

// at returns the membership for slot s.
func (h *confHistory) at(s Slot) []NodeID {
	for i := len(h.epochs) - 1; i >= 0; i-- {
		if h.epochs[i].from <= s {
			return h.epochs[i].members
		}
	}
	return h.epochs[0].members
}

// latest returns the newest membership.
func (h *confHistory) latest() []NodeID { return h.epochs[len(h.epochs)-1].members }

// add records that members govern slots >= from.
func (h *confHistory) add(from Slot, members []NodeID) {
	h.epochs = append(h.epochs, confEpoch{from: from, members: members})
}

// reset forgets everything and starts with members from slot from.
func (h *confHistory) reset(from Slot, members []NodeID) {
	m := slices.Clone(members)
	slices.Sort(m)
	h.epochs = []confEpoch{{from: from, members: m}}
}

// prune drops epochs wholly below slot s (kept: the one in force at s).
func (h *confHistory) prune(s Slot) {
	i := 0
	for i+1 < len(h.epochs) && h.epochs[i+1].from <= s {
		i++
	}
	if i > 0 {
		h.epochs = slices.Delete(h.epochs, 0, i)
	}
}
