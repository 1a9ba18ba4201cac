package sm

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// The committed membership. The replica runtime proposes every membership
// change with the whole resulting membership, every member's addresses
// included, encoded as below (the change's context); applying the change
// stores those bytes under membersKey, in the same Pebble batch as the
// applied slot. So the membership a node uses is owned by the log: it is
// durable with the data, it travels in snapshots (membersKey is a metadata
// key like the others), and a restarted or restored node reads it back
// instead of trusting its config's peers, which only bootstrap a new
// cluster.
//
// Encoding (part of the on-disk format and of ConfChange contexts):
//
//	version u8 = 1 | count u16 BE | member*
//	member := id u64 BE | flags u8 (bit 0: learner) |
//	          consensus address length u8 | bytes | client address length u8 | bytes
//
// Members are in strictly increasing id order; at most MembersMax of them
// (paxos.MembersMax: kv/replica checks the two agree at compile time);
// addresses are 1..MemberAddrBytesMax bytes. The stored value is the
// change's slot (u64 BE) followed by this encoding.
const (
	membersVersion = 1
	// MembersMax bounds the members of an encoded membership.
	MembersMax = 64
	// MemberAddrBytesMax bounds one address of a member.
	MemberAddrBytesMax = 255
	// MembershipBytesMax bounds an encoded membership.
	MembershipBytesMax = 3 + MembersMax*(8+1+2*(1+MemberAddrBytesMax))

	memberFlagLearner = 1 << 0
	memberFlagsKnown  = memberFlagLearner
)

// membersKey holds the committed membership: slot u64 BE | encoding.
var membersKey = []byte("\x00\x00\x00\x00members")

// ErrBadMembership reports an encoded membership that does not decode.
var ErrBadMembership = errors.New("sm: malformed membership")

// Member is one member of the group with its addresses.
type Member struct {
	ID uint64
	// ConsensusAddr is its consensus address (ip:port: UDP datagrams and
	// the TCP side channel).
	ConsensusAddr string
	// ClientAddr is where clients reach it (host:port).
	ClientAddr string
	// Learner: it receives the log but does not vote (paxos).
	Learner bool
}

// Membership is a membership as the log decided it: members in id order
// and the slot of the change that made it (0 when it was never changed
// through the log: a bootstrap membership, or one written by restore).
type Membership struct {
	Slot    uint64
	Members []Member
}

// EncodeMembership returns the encoding of members (in the order given; the
// decoder requires increasing ids).
func EncodeMembership(members []Member) []byte {
	b := make([]byte, 0, 3+len(members)*32)
	b = append(b, membersVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(len(members)))
	for _, m := range members {
		b = binary.BigEndian.AppendUint64(b, m.ID)
		var flags byte
		if m.Learner {
			flags |= memberFlagLearner
		}
		b = append(b, flags, byte(len(m.ConsensusAddr)))
		b = append(b, m.ConsensusAddr...)
		b = append(b, byte(len(m.ClientAddr)))
		b = append(b, m.ClientAddr...)
	}
	return b
}

// DecodeMembership decodes EncodeMembership's output, checking every count,
// length, flag and the id order. Malformed input is an error wrapping
// ErrBadMembership, never a panic; the result does not alias b.
func DecodeMembership(b []byte) ([]Member, error) {
	bad := func(format string, args ...any) ([]Member, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{ErrBadMembership}, args...)...)
	}
	if len(b) > MembershipBytesMax {
		return bad("%d bytes exceed %d", len(b), MembershipBytesMax)
	}
	if len(b) < 3 {
		return bad("%d bytes", len(b))
	}
	if b[0] != membersVersion {
		return bad("version %d", b[0])
	}
	n := int(binary.BigEndian.Uint16(b[1:3]))
	if n == 0 || n > MembersMax {
		return bad("%d members outside 1..%d", n, MembersMax)
	}
	b = b[3:]
	out := make([]Member, 0, n)
	addr := func(what string) (string, error) {
		if len(b) < 1 {
			return "", fmt.Errorf("%w: member %d: %s address truncated", ErrBadMembership, len(out), what)
		}
		l := int(b[0])
		if l == 0 || len(b) < 1+l {
			return "", fmt.Errorf("%w: member %d: %s address of %d bytes in %d", ErrBadMembership, len(out), what, l, len(b)-1)
		}
		s := string(b[1 : 1+l])
		b = b[1+l:]
		return s, nil
	}
	for range n {
		if len(b) < 9 {
			return bad("member %d truncated", len(out))
		}
		m := Member{ID: binary.BigEndian.Uint64(b)}
		flags := b[8]
		b = b[9:]
		if m.ID == 0 {
			return bad("member %d has id 0", len(out))
		}
		if len(out) > 0 && m.ID <= out[len(out)-1].ID {
			return bad("member ids not increasing at %d", m.ID)
		}
		if flags&^memberFlagsKnown != 0 {
			return bad("member %d: unknown flags %#x", m.ID, flags)
		}
		m.Learner = flags&memberFlagLearner != 0
		var err error
		if m.ConsensusAddr, err = addr("consensus"); err != nil {
			return nil, err
		}
		if m.ClientAddr, err = addr("client"); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if len(b) != 0 {
		return bad("%d trailing bytes", len(b))
	}
	return out, nil
}

// ApplyMembership applies the membership change committed at slot: it
// records encoded (EncodeMembership's output) as the membership and slot as
// applied, in one Pebble batch. A slot at or below Applied() was applied
// already: nothing happens. An encoding that does not decode changes
// nothing and returns an error wrapping ErrBadMembership (every replica
// decides the same on the same bytes; the caller then applies the slot as
// an empty one). Any other error is a storage failure, as for Apply.
func (s *SM) ApplyMembership(slot uint64, encoded []byte) error {
	if _, err := DecodeMembership(encoded); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if next, err := s.nextSlot(slot); !next {
		return err
	}
	batch := s.db.NewBatch()
	defer batch.Close()
	val := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(encoded)), slot)
	val = append(val, encoded...)
	err := batch.Set(membersKey, val, nil)
	if err == nil {
		err = setApplied(batch, slot)
	}
	if err == nil {
		err = batch.Commit(pebble.NoSync)
	}
	if err != nil {
		s.broken = fmt.Errorf("sm: applying the membership change at slot %d: %w", slot, err)
		return s.broken
	}
	s.applied.Store(slot)
	return nil
}

// SetMembership records members as the membership without applying a slot
// (Slot 0 in Membership): kvnode restore writes the new cluster's
// membership this way, before the node first starts. It is durable when it
// returns.
func (s *SM) SetMembership(members []Member) error {
	enc := EncodeMembership(members)
	if _, err := DecodeMembership(enc); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.dbClosed {
		return ErrClosed
	}
	val := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(enc)), 0)
	val = append(val, enc...)
	// Pebble runs without its WAL: the flush makes the write durable.
	if err := s.db.Set(membersKey, val, pebble.NoSync); err != nil {
		return fmt.Errorf("sm: recording the membership: %w", err)
	}
	if err := s.db.Flush(); err != nil {
		return fmt.Errorf("sm: recording the membership: %w", err)
	}
	return nil
}

// Membership returns the membership the log last decided (ok false when
// none was ever recorded: the cluster still runs on its bootstrap peers).
func (s *SM) Membership() (m Membership, ok bool, err error) {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.dbClosed {
		return Membership{}, false, ErrClosed
	}
	v, ok, err := s.getRaw(membersKey)
	if err != nil || !ok {
		return Membership{}, false, err
	}
	if len(v) < 8 {
		return Membership{}, false, fmt.Errorf("%w: stored value of %d bytes", ErrBadMembership, len(v))
	}
	members, err := DecodeMembership(v[8:])
	if err != nil {
		return Membership{}, false, err
	}
	return Membership{Slot: binary.BigEndian.Uint64(v), Members: members}, true, nil
}
