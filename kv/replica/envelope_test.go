package replica

import (
	"bytes"
	"encoding/binary"
	"testing"

	"synod/kv/proto"
	"synod/kv/sm"
)

// appendEnvelope appends the envelope of cmd to buf, field by field: the
// layout written out as a reference for the tests (the runtime stamps the
// header into the room left in front of an encoded command,
// putEnvelopeHeader).
func appendEnvelope(buf []byte, id proposalID, cmd []byte) []byte {
	buf = append(buf, envelopeVersion)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(id.origin))
	buf = binary.LittleEndian.AppendUint64(buf, id.boot)
	buf = binary.LittleEndian.AppendUint64(buf, id.seq)
	return append(buf, cmd...)
}

func TestEnvelopeRoundTrip(t *testing.T) {
	want := proposalID{origin: 3, boot: 0xfeedface12345678, seq: 99}
	b := appendEnvelope(nil, want, []byte("cmd"))
	id, cmd, err := parseEnvelope(b)
	if err != nil || id != want || string(cmd) != "cmd" {
		t.Fatalf("got %+v %q %v", id, cmd, err)
	}
	for _, bad := range [][]byte{nil, {envelopeVersion}, b[:envelopeHeaderBytes-1], append([]byte{9}, b[1:]...),
		{envelopeV1}, make([]byte, envelopeV1HeaderBytes-1)} {
		if _, _, err := parseEnvelope(bad); err == nil {
			t.Fatalf("accepted %x", bad)
		}
	}
	// A version-1 envelope (no boot id) from an older log still parses,
	// with boot id 0, which no running process has.
	v1 := append([]byte{envelopeV1}, binary.LittleEndian.AppendUint64(nil, 3)...)
	v1 = binary.LittleEndian.AppendUint64(v1, 99)
	v1 = append(v1, "cmd"...)
	id, cmd, err = parseEnvelope(v1)
	if err != nil || id != (proposalID{origin: 3, seq: 99}) || string(cmd) != "cmd" {
		t.Fatalf("v1: got %+v %q %v", id, cmd, err)
	}
}

// TestEnvelopeRoomSameBytes: a command encoded into envelopeRoom and
// stamped by putEnvelopeHeader (WriteRequest, submitEnvelope) is the same
// log entry appendEnvelope makes of EncodeCommand (Write, submitWrite),
// with no copy when CommandBytes held the command.
func TestEnvelopeRoomSameBytes(t *testing.T) {
	id := proposalID{origin: 2, boot: 0x0123456789abcdef, seq: 1 << 40}
	req := &proto.Request{Op: proto.OpPut, ClientID: 7, Seq: 9, FirstUnacked: 8, Key: []byte("key"), Value: bytes.Repeat([]byte("v"), 4096)}
	want := appendEnvelope(nil, id, sm.EncodeCommand(5, req))
	room := envelopeRoom(sm.CommandBytes(req))
	env := sm.AppendCommand(room, 5, req)
	putEnvelopeHeader(env, id)
	if !bytes.Equal(env, want) {
		t.Fatalf("envelopeRoom+putEnvelopeHeader differs from appendEnvelope:\n%x\n%x", env[:40], want[:40])
	}
	if &env[0] != &room[:1][0] {
		t.Fatalf("the command did not fit its room (%d bytes, room %d): it was copied", len(env), cap(room))
	}
}

// FuzzParseEnvelope: committed commands come from the network via other
// replicas; any bytes must parse or fail cleanly, and a parsed version-2
// envelope re-encodes to the same bytes.
func FuzzParseEnvelope(f *testing.F) {
	f.Add(appendEnvelope(nil, proposalID{1, 2, 3}, []byte("x")))
	f.Add([]byte{})
	f.Add([]byte{envelopeVersion})
	f.Add(append([]byte{envelopeV1}, make([]byte, 20)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, cmd, err := parseEnvelope(b)
		if err != nil {
			return
		}
		if b[0] == envelopeV1 {
			if id.boot != 0 || len(cmd) != len(b)-envelopeV1HeaderBytes {
				t.Fatalf("v1 parsed as %+v, %d command bytes", id, len(cmd))
			}
			return
		}
		if again := appendEnvelope(nil, id, cmd); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %x vs %x", again, b)
		}
	})
}
