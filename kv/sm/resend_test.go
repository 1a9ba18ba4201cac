package sm

import (
	"testing"

	"synod/kv/proto"
)

// TestResentSeqOtherPayloadDoesNothing: a write re-sent under a seq that
// has a remembered result returns that result and applies nothing, even
// when its payload differs (docs/protocol.md, "The same seq with a
// different payload").
func TestResentSeqOtherPayloadDoesNothing(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	if res := a.apply(1, &proto.Request{Op: proto.OpPut, ClientID: 9, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("first")}); res.Status != proto.StatusOK {
		t.Fatalf("first write: %v", res.Status)
	}
	// Same (client, seq): another value, and another opcode.
	for _, req := range []*proto.Request{
		{Op: proto.OpPut, ClientID: 9, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("second")},
		{Op: proto.OpDelete, ClientID: 9, Seq: 1, FirstUnacked: 1, Key: []byte("k")},
		{Op: proto.OpCAS, ClientID: 9, Seq: 1, FirstUnacked: 1, Key: []byte("k"), ExpectPresent: true, Expect: []byte("nope"), Value: []byte("x")},
	} {
		if res := a.apply(1, req); res.Status != proto.StatusOK {
			t.Fatalf("re-sent seq 1 as %v: %v, want the remembered OK", req.Op, res.Status)
		}
	}
	if v, ok, err := s.Get(1, []byte("k")); err != nil || !ok || string(v) != "first" {
		t.Fatalf("k = %q %v %v, want the first write's value", v, ok, err)
	}
}
