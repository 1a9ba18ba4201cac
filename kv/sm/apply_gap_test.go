package sm

import (
	"errors"
	"testing"

	"synod/kv/proto"
)

// TestApplyRefusesASkippedSlot holds Apply's and ApplyMembership's contract
// that slots are applied one after another: a slot above Applied()+1 is
// refused with ErrSlotGap and changes nothing (no value, no applied slot, no
// membership), and the SM goes on at the next slot. A replica once handed
// its state machine slots 1910, 1911, 1914 at shutdown and the SM took them,
// diverging silently from the others (kv/replica, the Ready loop).
func TestApplyRefusesASkippedSlot(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	put := func(seq uint64, v string) []byte {
		return EncodeCommand(1, &proto.Request{Op: proto.OpPut, ClientID: 1, Seq: seq, FirstUnacked: seq, Key: []byte("k"), Value: []byte(v)})
	}
	if _, err := s.Apply(1, [][]byte{put(1, "one")}); err != nil {
		t.Fatal(err)
	}
	refused := 0
	if res, err := s.Apply(3, [][]byte{put(2, "three")}); !errors.Is(err, ErrSlotGap) || res != nil {
		t.Fatalf("slot 3 after 1: results %v, err %v; want ErrSlotGap", res, err)
	} else {
		refused++
		t.Logf("refused: %v", err)
	}
	if err := s.ApplyMembership(3, EncodeMembership(testMembers)); !errors.Is(err, ErrSlotGap) {
		t.Fatalf("membership at slot 3 after 1: %v; want ErrSlotGap", err)
	}
	refused++
	if v, _ := mustGet(t, s, 1, "k"); v != "one" || s.Applied() != 1 {
		t.Fatalf("after the refused slots: value %q applied %d; want \"one\" 1", v, s.Applied())
	}
	if m, ok, err := s.Membership(); err != nil || ok {
		t.Fatalf("the refused membership change was recorded: %+v %v %v", m, ok, err)
	}
	// The SM is not broken: the next slots apply.
	if err := s.ApplyMembership(2, EncodeMembership(testMembers)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(3, [][]byte{put(2, "three")}); err != nil {
		t.Fatal(err)
	}
	if v, _ := mustGet(t, s, 1, "k"); v != "three" || s.Applied() != 3 {
		t.Fatalf("value %q applied %d; want \"three\" 3", v, s.Applied())
	}
	t.Logf("slot gap: refused=%d applied=%d", refused, s.Applied())
}
