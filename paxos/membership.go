package paxos

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Membership. A configuration has voters and learners:
//
//   - Voters are the acceptors: every quorum (commit, phase 1, pre-check,
//     check quorum, lease) is a majority of the voters of the slot it
//     concerns, and only voters campaign.
//   - Learners receive the log like any acceptor (Accepts, heartbeats,
//     catch-up, snapshots) and answer, but no count ever includes them: a
//     learner's Accepted commits nothing, its heartbeat answer extends no
//     lease. A learner is a future voter that is catching up; ConfPromote
//     makes it one (refused while it lags: ErrLearnerBehind).
//
// Voters and learners are disjoint, together at most MembersMax. Every
// change is one ConfChange through the log, one at a time, under the rule
// on ProposeConfChange. Adding or removing a learner leaves every quorum
// as it was; promoting one or removing a voter changes the voters by one,
// so every majority before intersects every majority after.

// ErrBadConfChange reports a membership change that cannot apply (adding a
// member, removing a non-member, promoting a non-learner, removing the last
// voter, too many members).
var ErrBadConfChange = errors.New("paxos: invalid membership change")

// ErrLearnerBehind reports a ConfPromote of a learner whose commit index,
// as the leader last heard it, is more than PromoteLagSlotsMax below the
// leader's (or that the leader has not heard from): promoted now, it could
// not acknowledge new slots, and the group would have one more voter that
// cannot help form a quorum.
var ErrLearnerBehind = errors.New("paxos: the learner is too far behind to be promoted")

// PromoteLagSlotsMax is how many slots a learner's commit index may lag
// the leader's for ConfPromote to be accepted.
const PromoteLagSlotsMax = inflightSlotsMax

// ConfChangeContextBytesMax bounds ConfChange.Context.
const ConfChangeContextBytesMax = 64 << 10

// ConfChange encodings. confChangeVersionV1 is the original one (type and
// node, no context; types ConfAddNode and ConfRemoveNode only): entries in
// acceptor logs written before learners existed still decode. New changes
// are encoded as confChangeVersion:
//
//	version u8 = 2 | type u8 | node u64 | context length u32 | context
const (
	confChangeVersionV1 = 1
	confChangeVersion   = 2
	confChangeV1Bytes   = 1 + 1 + 8
	confChangeHeadBytes = 1 + 1 + 8 + 4
)

// EncodeConfChange returns the encoding of cc carried in an EntryConfChange.
func EncodeConfChange(cc ConfChange) []byte {
	b := make([]byte, 0, confChangeHeadBytes+len(cc.Context))
	b = append(b, confChangeVersion, byte(cc.Type))
	b = binary.LittleEndian.AppendUint64(b, uint64(cc.Node))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(cc.Context)))
	return append(b, cc.Context...)
}

// DecodeConfChange decodes what EncodeConfChange produced (either version).
// The result does not alias b.
func DecodeConfChange(b []byte) (ConfChange, error) {
	if len(b) == 0 {
		return ConfChange{}, fmt.Errorf("%w: empty conf change", errDecode)
	}
	var cc ConfChange
	switch b[0] {
	case confChangeVersionV1:
		if len(b) != confChangeV1Bytes {
			return ConfChange{}, fmt.Errorf("%w: conf change of %d bytes, want %d", errDecode, len(b), confChangeV1Bytes)
		}
		cc = ConfChange{Type: ConfChangeType(b[1]), Node: NodeID(binary.LittleEndian.Uint64(b[2:]))}
		if cc.Type != ConfAddNode && cc.Type != ConfRemoveNode {
			return ConfChange{}, fmt.Errorf("%w: version 1 conf change type %d", errDecode, cc.Type)
		}
	case confChangeVersion:
		if len(b) < confChangeHeadBytes {
			return ConfChange{}, fmt.Errorf("%w: conf change of %d bytes, want at least %d", errDecode, len(b), confChangeHeadBytes)
		}
		cc = ConfChange{Type: ConfChangeType(b[1]), Node: NodeID(binary.LittleEndian.Uint64(b[2:]))}
		n := binary.LittleEndian.Uint32(b[10:])
		if n > ConfChangeContextBytesMax {
			return ConfChange{}, fmt.Errorf("%w: conf change context of %d bytes exceeds %d", errDecode, n, ConfChangeContextBytesMax)
		}
		if uint64(len(b)-confChangeHeadBytes) != uint64(n) {
			return ConfChange{}, fmt.Errorf("%w: conf change context of %d bytes in %d", errDecode, n, len(b)-confChangeHeadBytes)
		}
		if n > 0 {
			cc.Context = slices.Clone(b[confChangeHeadBytes:])
		}
		if cc.Type < ConfAddNode || cc.Type > ConfPromote {
			return ConfChange{}, fmt.Errorf("%w: conf change type %d", errDecode, cc.Type)
		}
	default:
		return ConfChange{}, fmt.Errorf("%w: conf change version %d", errDecode, b[0])
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

// applyConfChange returns the voters and learners after cc, or an error
// when cc does not apply to them. The arguments are not modified; the
// results are sorted.
func applyConfChange(voters, learners []NodeID, cc ConfChange) ([]NodeID, []NodeID, error) {
	isVoter, isLearner := slices.Contains(voters, cc.Node), slices.Contains(learners, cc.Node)
	switch cc.Type {
	case ConfAddNode, ConfAddLearner:
		if isVoter {
			return nil, nil, fmt.Errorf("%w: node %d is already a voter", ErrBadConfChange, cc.Node)
		}
		if isLearner {
			return nil, nil, fmt.Errorf("%w: node %d is already a learner", ErrBadConfChange, cc.Node)
		}
		if len(voters)+len(learners) >= MembersMax {
			return nil, nil, fmt.Errorf("%w: %d members is the limit", ErrBadConfChange, MembersMax)
		}
		if cc.Type == ConfAddNode {
			return sortedWith(voters, cc.Node), slices.Clone(learners), nil
		}
		return slices.Clone(voters), sortedWith(learners, cc.Node), nil
	case ConfPromote:
		if !isLearner {
			return nil, nil, fmt.Errorf("%w: node %d is not a learner", ErrBadConfChange, cc.Node)
		}
		return sortedWith(voters, cc.Node), without(learners, cc.Node), nil
	case ConfRemoveNode:
		switch {
		case isLearner:
			return slices.Clone(voters), without(learners, cc.Node), nil
		case !isVoter:
			return nil, nil, fmt.Errorf("%w: node %d is not a member", ErrBadConfChange, cc.Node)
		case len(voters) == 1:
			return nil, nil, fmt.Errorf("%w: cannot remove the last voter", ErrBadConfChange)
		}
		return without(voters, cc.Node), slices.Clone(learners), nil
	}
	return nil, nil, fmt.Errorf("%w: type %d", ErrBadConfChange, cc.Type)
}

func sortedWith(ids []NodeID, id NodeID) []NodeID {
	out := append(slices.Clone(ids), id)
	slices.Sort(out)
	return out
}

func without(ids []NodeID, id NodeID) []NodeID {
	return slices.DeleteFunc(slices.Clone(ids), func(x NodeID) bool { return x == id })
}

// checkConfChange is the leader's admission of cc (ProposeConfChange): it
// must apply to the latest membership, and a learner is promoted only once
// the leader has heard it within PromoteLagSlotsMax of its commit index.
func (n *Node) checkConfChange(cc ConfChange) error {
	if len(cc.Context) > ConfChangeContextBytesMax {
		return fmt.Errorf("%w: context of %d bytes exceeds %d", ErrBadConfChange, len(cc.Context), ConfChangeContextBytesMax)
	}
	if cc.Node == 0 {
		return fmt.Errorf("%w: node 0", ErrBadConfChange)
	}
	if _, _, err := applyConfChange(n.conf.latest(), n.conf.latestLearners(), cc); err != nil {
		return err
	}
	if cc.Type == ConfPromote {
		p := n.lead.peers[cc.Node]
		heard, ok := n.heard[cc.Node]
		switch {
		case p == nil || !ok || n.now-heard > int64(n.cfg.ElectionTicks):
			return fmt.Errorf("%w: node %d has not been heard from within an election timeout", ErrLearnerBehind, cc.Node)
		case p.commit+PromoteLagSlotsMax < n.commit:
			return fmt.Errorf("%w: node %d reported commit index %d, the leader's is %d (at most %d behind)",
				ErrLearnerBehind, cc.Node, p.commit, n.commit, PromoteLagSlotsMax)
		}
	}
	return nil
}

// isVoter reports whether this node is a voter of the latest membership:
// only voters campaign and lead.
func (n *Node) isVoter() bool { return slices.Contains(n.conf.latest(), n.id) }

// countsFor reports whether an Accepted from id counts toward slot s: only
// the voters of s form its quorum.
func (n *Node) countsFor(s Slot, id NodeID) bool {
	return slices.Contains(n.conf.at(s), id) || (TestingLearnerAcksCount && slices.Contains(n.conf.learnersAt(s), id))
}

// replicasAt lists every member of the membership governing slot s,
// voters and learners: they all get the slot's Accepts.
func (n *Node) replicasAt(s Slot) []NodeID {
	return slices.Concat(n.conf.at(s), n.conf.learnersAt(s))
}

// confEpoch is a membership in force for every slot >= from (until the next
// epoch).
type confEpoch struct {
	from     Slot
	members  []NodeID // the voters, sorted
	learners []NodeID // sorted, disjoint from members
}

// confHistory is the sequence of memberships decided by committed
// ConfChange entries. Invariant: epochs are in increasing from order and
// epochs[0].from <= every slot the node still reasons about.
type confHistory struct {
	epochs []confEpoch
}

// epochAt returns the epoch governing slot s.
func (h *confHistory) epochAt(s Slot) *confEpoch {
	for i := len(h.epochs) - 1; i >= 0; i-- {
		if h.epochs[i].from <= s {
			return &h.epochs[i]
		}
	}
	return &h.epochs[0]
}

// at returns the voters for slot s.
func (h *confHistory) at(s Slot) []NodeID { return h.epochAt(s).members }

// learnersAt returns the learners for slot s.
func (h *confHistory) learnersAt(s Slot) []NodeID { return h.epochAt(s).learners }

// latest returns the newest voters.
func (h *confHistory) latest() []NodeID { return h.epochs[len(h.epochs)-1].members }

// latestLearners returns the newest learners.
func (h *confHistory) latestLearners() []NodeID { return h.epochs[len(h.epochs)-1].learners }

// add records that voters and learners govern slots >= from.
func (h *confHistory) add(from Slot, voters, learners []NodeID) {
	h.epochs = append(h.epochs, confEpoch{from: from, members: voters, learners: learners})
}

// reset forgets everything and starts with members (all voters) from slot
// from.
func (h *confHistory) reset(from Slot, members []NodeID) { h.resetWith(from, members, nil) }

// resetWith forgets everything and starts with voters and learners from
// slot from.
func (h *confHistory) resetWith(from Slot, voters, learners []NodeID) {
	v, l := slices.Clone(voters), slices.Clone(learners)
	slices.Sort(v)
	slices.Sort(l)
	h.epochs = []confEpoch{{from: from, members: v, learners: l}}
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
