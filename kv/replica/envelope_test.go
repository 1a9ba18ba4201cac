package replica

import (
	"bytes"
	"testing"

	"synod/paxos"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	b := appendEnvelope(nil, 3, 99, []byte("cmd"))
	o, id, cmd, err := parseEnvelope(b)
	if err != nil || o != 3 || id != 99 || string(cmd) != "cmd" {
		t.Fatalf("got %d %d %q %v", o, id, cmd, err)
	}
	for _, bad := range [][]byte{nil, {1}, b[:envelopeHeaderBytes-1], append([]byte{9}, b[1:]...)} {
		if _, _, _, err := parseEnvelope(bad); err == nil {
			t.Fatalf("accepted %x", bad)
		}
	}
}

// FuzzParseEnvelope: committed commands come from the network via other
// replicas; any bytes must parse or fail cleanly, and a parsed envelope
// re-encodes to the same bytes.
func FuzzParseEnvelope(f *testing.F) {
	f.Add(appendEnvelope(nil, 1, 1, []byte("x")))
	f.Add([]byte{})
	f.Add([]byte{envelopeVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		o, id, cmd, err := parseEnvelope(b)
		if err != nil {
			return
		}
		if again := appendEnvelope(nil, paxos.NodeID(o), id, cmd); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %x vs %x", again, b)
		}
	})
}
