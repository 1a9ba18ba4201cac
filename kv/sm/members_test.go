package sm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

var testMembers = []Member{
	{ID: 1, ConsensusAddr: "10.0.0.1:7001", ClientAddr: "10.0.0.1:7000"},
	{ID: 2, ConsensusAddr: "10.0.0.2:7001", ClientAddr: "node2.example:7000"},
	{ID: 4, ConsensusAddr: "[fd00::4]:7001", ClientAddr: "[fd00::4]:7000", Learner: true},
}

func TestMembershipRoundTrip(t *testing.T) {
	got, err := DecodeMembership(EncodeMembership(testMembers))
	if err != nil || !reflect.DeepEqual(got, testMembers) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	// The largest membership fits the bound.
	big := make([]Member, MembersMax)
	for i := range big {
		a := strings.Repeat("x", MemberAddrBytesMax)
		big[i] = Member{ID: uint64(i + 1), ConsensusAddr: a, ClientAddr: a, Learner: i%2 == 0}
	}
	enc := EncodeMembership(big)
	if len(enc) != MembershipBytesMax {
		t.Fatalf("largest membership encodes to %d bytes, MembershipBytesMax is %d", len(enc), MembershipBytesMax)
	}
	if got, err := DecodeMembership(enc); err != nil || !reflect.DeepEqual(got, big) {
		t.Fatalf("largest membership: %v", err)
	}
}

// TestDecodeMembershipRefusesMalformed: every malformed encoding is an
// ErrBadMembership, never a panic or a partial result.
func TestDecodeMembershipRefusesMalformed(t *testing.T) {
	good := EncodeMembership(testMembers)
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":            nil,
		"short":            good[:2],
		"version":          edit(func(b []byte) []byte { b[0] = 2; return b }),
		"zero members":     {1, 0, 0},
		"too many members": {1, 0, MembersMax + 1},
		"count above data": edit(func(b []byte) []byte { b[2] = 9; return b }),
		"truncated":        good[:len(good)-1],
		"trailing":         append(bytes.Clone(good), 0),
		"id zero":          EncodeMembership([]Member{{ID: 0, ConsensusAddr: "a", ClientAddr: "b"}}),
		"ids unordered":    EncodeMembership([]Member{testMembers[1], testMembers[0]}),
		"ids repeated":     EncodeMembership([]Member{testMembers[0], testMembers[0]}),
		"unknown flag":     edit(func(b []byte) []byte { b[3+8] = 0x80; return b }),
		"empty address":    EncodeMembership([]Member{{ID: 1, ConsensusAddr: "", ClientAddr: "b"}}),
		"too long":         make([]byte, MembershipBytesMax+1),
	}
	for name, b := range cases {
		if m, err := DecodeMembership(b); !errors.Is(err, ErrBadMembership) || m != nil {
			t.Errorf("%s: %+v, %v", name, m, err)
		}
	}
}

func FuzzDecodeMembership(f *testing.F) {
	f.Add(EncodeMembership(testMembers))
	f.Add([]byte{1, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMembership(b)
		if err != nil {
			return
		}
		if again := EncodeMembership(m); !bytes.Equal(again, b) {
			t.Fatalf("decoded %+v re-encodes to %x, not %x", m, again, b)
		}
	})
}

// TestApplyMembership: the membership and the applied slot move together,
// survive a reopen, replay is idempotent, and a malformed membership
// changes nothing.
func TestApplyMembership(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	if _, ok, err := s.Membership(); ok || err != nil {
		t.Fatalf("a new store has a membership: %v %v", ok, err)
	}
	newApplier(t, s).apply(1, put("a", "1"))
	if err := s.ApplyMembership(2, EncodeMembership(testMembers)); err != nil {
		t.Fatal(err)
	}
	if s.Applied() != 2 {
		t.Fatalf("applied %d, want 2", s.Applied())
	}
	want := Membership{Slot: 2, Members: testMembers}
	if m, ok, err := s.Membership(); !ok || err != nil || !reflect.DeepEqual(m, want) {
		t.Fatalf("membership %+v %v %v", m, ok, err)
	}
	// A replay of an applied slot changes nothing.
	if err := s.ApplyMembership(2, EncodeMembership(testMembers[:1])); err != nil {
		t.Fatal(err)
	}
	if m, _, _ := s.Membership(); !reflect.DeepEqual(m, want) {
		t.Fatalf("a replayed slot changed the membership: %+v", m)
	}
	if err := s.ApplyMembership(3, []byte{1, 2}); !errors.Is(err, ErrBadMembership) || s.Applied() != 2 {
		t.Fatalf("malformed membership: %v, applied %d", err, s.Applied())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir)
	defer s.Close()
	if m, ok, err := s.Membership(); !ok || err != nil || !reflect.DeepEqual(m, want) || s.Applied() != 2 {
		t.Fatalf("after reopen: %+v %v %v applied %d", m, ok, err, s.Applied())
	}
}

// TestMembershipTravelsInSnapshots: a snapshot carries the membership, the
// restored store reports it, VerifySnapshot shows it, and a stream whose
// membership does not decode is refused.
func TestMembershipTravelsInSnapshots(t *testing.T) {
	src := openT(t, t.TempDir())
	defer src.Close()
	newApplier(t, src).apply(1, put("a", "1"))
	if err := src.ApplyMembership(2, EncodeMembership(testMembers)); err != nil {
		t.Fatal(err)
	}
	rc, _, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	stream, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := Membership{Slot: 2, Members: testMembers}
	info, err := VerifySnapshot(bytes.NewReader(stream))
	if err != nil || !info.HasMembership || !reflect.DeepEqual(info.Membership, want) {
		t.Fatalf("verify: %+v, %v", info, err)
	}
	dst := openT(t, t.TempDir())
	defer dst.Close()
	if err := dst.Restore(bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	if m, ok, err := dst.Membership(); !ok || err != nil || !reflect.DeepEqual(m, want) {
		t.Fatalf("restored membership %+v %v %v", m, ok, err)
	}

	// Corrupt the membership's value (its version byte) and reseal.
	i := bytes.Index(stream, membersKey)
	body := bytes.Clone(stream[:len(stream)-17])
	vlen := int(binary.BigEndian.Uint32(body[i+len(membersKey):]))
	if vlen < 9 {
		t.Fatalf("membership value of %d bytes", vlen)
	}
	body[i+len(membersKey)+4+8] = 7
	if _, err := VerifySnapshot(bytes.NewReader(reseal(t, body, info.Records))); !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("a snapshot with a malformed membership verified: %v", err)
	}
}

// TestSetMembership: restore's way of writing a new cluster's membership.
func TestSetMembership(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	if err := s.SetMembership(testMembers[:2]); err != nil {
		t.Fatal(err)
	}
	s.Abandon() // durable without Close
	s = openT(t, dir)
	defer s.Close()
	if m, ok, err := s.Membership(); !ok || err != nil || m.Slot != 0 || !reflect.DeepEqual(m.Members, testMembers[:2]) {
		t.Fatalf("membership %+v %v %v", m, ok, err)
	}
	if err := s.SetMembership([]Member{{ID: 3}}); !errors.Is(err, ErrBadMembership) {
		t.Fatalf("a membership without addresses was recorded: %v", err)
	}
}
