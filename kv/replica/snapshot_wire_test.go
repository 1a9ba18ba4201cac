package replica

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"reflect"
	"testing"
	"time"

	"synod/kv/sm"
	"synod/paxos"
)

// appendSnapRequestUnaddressed and appendSnapDeltaRequestUnaddressed
// encode the requests of an earlier version, which name no server.
func appendSnapRequestUnaddressed(b []byte, id uint64, from paxos.NodeID, commit uint64) []byte {
	b = appendSnapHead(b, snapFrameRequest, id)
	b = binary.LittleEndian.AppendUint64(b, uint64(from))
	return binary.LittleEndian.AppendUint64(b, commit)
}

func appendSnapDeltaRequestUnaddressed(b []byte, id uint64, from paxos.NodeID, commit uint64, digest []byte) []byte {
	b = appendSnapHead(b, snapFrameDeltaRequest, id)
	b = binary.LittleEndian.AppendUint64(b, uint64(from))
	b = binary.LittleEndian.AppendUint64(b, commit)
	return append(b, digest...)
}

func sampleSnapFrames() [][]byte {
	meta := paxos.SnapshotMeta{Slot: 42, Members: []paxos.NodeID{1, 2, 3}}
	return [][]byte{
		appendSnapRequestUnaddressed(nil, 7, 2, 99),
		appendSnapHeader(nil, 7, &meta),
		appendSnapChunk(nil, 7, 1, []byte("state bytes")),
		appendSnapChunk(nil, 7, 2, nil),
		appendSnapEnd(nil, 7, 2, 11),
		appendSnapRefuse(nil, 7, snapRefuseBusy),
		appendSnapDeltaRequestUnaddressed(nil, 7, 2, 99, []byte("digest")),
		appendSnapRequest(nil, 7, 2, 3, 99),
		appendSnapDeltaRequest(nil, 7, 2, 3, 99, []byte("digest")),
	}
}

// TestSnapFrameRoundTrip: every kind decodes to what was encoded; every
// strict prefix, a trailing byte (but for a chunk or a delta request,
// whose data runs to the end), an unknown kind or version is an error,
// never a panic; a delta request needs a digest, of at most
// sm.DeltaDigestBytesMax bytes.
func TestSnapFrameRoundTrip(t *testing.T) {
	want := []snapFrame{
		{kind: snapFrameRequest, id: 7, from: 2, commit: 99},
		{kind: snapFrameHeader, id: 7, meta: paxos.SnapshotMeta{Slot: 42, Members: []paxos.NodeID{1, 2, 3}}},
		{kind: snapFrameChunk, id: 7, seq: 1, data: []byte("state bytes")},
		{kind: snapFrameChunk, id: 7, seq: 2, data: []byte{}},
		{kind: snapFrameEnd, id: 7, seq: 2, bytes: 11},
		{kind: snapFrameRefuse, id: 7, reason: snapRefuseBusy},
		{kind: snapFrameDeltaRequest, id: 7, from: 2, commit: 99, digest: []byte("digest")},
		{kind: snapFrameAddressedRequest, id: 7, from: 2, to: 3, commit: 99},
		{kind: snapFrameAddressedDeltaRequest, id: 7, from: 2, to: 3, commit: 99, digest: []byte("digest")},
	}
	for i, b := range sampleSnapFrames() {
		got, err := decodeSnapFrame(b)
		if err != nil || !reflect.DeepEqual(got, want[i]) {
			t.Fatalf("frame %d: %+v, %v; want %+v", i, got, err, want[i])
		}
		for n := range b {
			if f, err := decodeSnapFrame(b[:n]); err == nil && !(f.kind == snapFrameChunk && n >= snapFrameHeadBytes+8) &&
				!(f.kind == snapFrameDeltaRequest && n > snapFrameHeadBytes+16) &&
				!(f.kind == snapFrameAddressedDeltaRequest && n > snapFrameHeadBytes+24) {
				t.Fatalf("frame %d: a prefix of %d/%d bytes decoded: %+v", i, n, len(b), f)
			}
		}
		if got.kind != snapFrameChunk && got.kind != snapFrameDeltaRequest && got.kind != snapFrameAddressedDeltaRequest {
			if _, err := decodeSnapFrame(append(bytes.Clone(b), 0)); err == nil {
				t.Fatalf("frame %d: a trailing byte was accepted", i)
			}
		}
		bad := bytes.Clone(b)
		bad[1] = snapFrameVersion + 1
		if _, err := decodeSnapFrame(bad); !errors.Is(err, errSnapFrame) {
			t.Fatalf("frame %d: version %d accepted: %v", i, bad[1], err)
		}
	}
	if _, err := decodeSnapFrame(appendSnapHead(nil, 9, 1)); !errors.Is(err, errSnapFrame) {
		t.Fatalf("kind 9: %v", err)
	}
	huge := appendSnapChunk(nil, 1, 1, make([]byte, snapshotChunkBytesMax+1))
	if _, err := decodeSnapFrame(huge); !errors.Is(err, errSnapFrame) {
		t.Fatalf("an oversized chunk decoded: %v", err)
	}
	if _, err := decodeSnapFrame(appendSnapRequest(nil, 1, 2, 0, 3)); !errors.Is(err, errSnapFrame) {
		t.Fatalf("a request to node 0 decoded: %v", err)
	}
	if _, err := decodeSnapFrame(appendSnapDeltaRequest(nil, 1, 2, 0, 3, []byte("d"))); !errors.Is(err, errSnapFrame) {
		t.Fatalf("a delta request to node 0 decoded: %v", err)
	}
	for _, enc := range []func(digest []byte) []byte{
		func(d []byte) []byte { return appendSnapDeltaRequestUnaddressed(nil, 1, 2, 3, d) },
		func(d []byte) []byte { return appendSnapDeltaRequest(nil, 1, 2, 3, 4, d) },
	} {
		if _, err := decodeSnapFrame(enc(make([]byte, sm.DeltaDigestBytesMax+1))); !errors.Is(err, errSnapFrame) {
			t.Fatalf("an oversized digest decoded: %v", err)
		}
		if _, err := decodeSnapFrame(enc(make([]byte, sm.DeltaDigestBytesMax))); err != nil {
			t.Fatalf("a digest of the largest size: %v", err)
		}
	}
}

// FuzzDecodeSnapFrame: decoding outside bytes never panics, and what
// decodes re-encodes to the same bytes.
func FuzzDecodeSnapFrame(f *testing.F) {
	for _, b := range sampleSnapFrames() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := decodeSnapFrame(b)
		if err != nil {
			return
		}
		var again []byte
		switch fr.kind {
		case snapFrameRequest:
			again = appendSnapRequestUnaddressed(nil, fr.id, fr.from, fr.commit)
		case snapFrameAddressedRequest:
			again = appendSnapRequest(nil, fr.id, fr.from, fr.to, fr.commit)
		case snapFrameAddressedDeltaRequest:
			again = appendSnapDeltaRequest(nil, fr.id, fr.from, fr.to, fr.commit, fr.digest)
		case snapFrameHeader:
			again = appendSnapHeader(nil, fr.id, &fr.meta)
		case snapFrameChunk:
			again = appendSnapChunk(nil, fr.id, fr.seq, fr.data)
		case snapFrameEnd:
			again = appendSnapEnd(nil, fr.id, fr.seq, fr.bytes)
		case snapFrameRefuse:
			again = appendSnapRefuse(nil, fr.id, fr.reason)
		case snapFrameDeltaRequest:
			again = appendSnapDeltaRequestUnaddressed(nil, fr.id, fr.from, fr.commit, fr.digest)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding changed the frame: %x -> %x", b, again)
		}
	})
}

// snapPipe connects two snapConns over a loopback TCP connection, sealed
// by a and b (nil: unsealed).
func snapPipe(t *testing.T, a, b *Auth) (client, server *snapConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc := <-acc
	t.Cleanup(func() { cc.Close(); sc.Close() })
	return newSnapConn(cc, nil, a), newSnapConn(sc, bufio.NewReader(sc), b)
}

func testAuths(t *testing.T) (*Auth, *Auth, *Auth) {
	t.Helper()
	secret := []byte("snapshot-transfer-secret-0123456")
	members := []paxos.NodeID{1, 2}
	now := time.Now()
	a1, err := NewAuth(9, 1, members, [][]byte{secret}, now)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := NewAuth(9, 2, members, [][]byte{secret}, now)
	if err != nil {
		t.Fatal(err)
	}
	wrong, err := NewAuth(9, 1, members, [][]byte{[]byte("another-secret-0123456789abcdef")}, now)
	if err != nil {
		t.Fatal(err)
	}
	return a1, a2, wrong
}

// TestSnapConnSealed: frames sealed by a member open at its peer with the
// sender known; a frame under another secret, a tampered one, a replayed
// one, and a side-channel frame on a transfer connection are refused.
func TestSnapConnSealed(t *testing.T) {
	a1, a2, wrong := testAuths(t)
	cl, srv := snapPipe(t, a1, a2)
	for _, p := range sampleSnapFrames() {
		if err := cl.write(p); err != nil {
			t.Fatal(err)
		}
		got, err := srv.read()
		if err != nil || !bytes.Equal(got, p) || srv.peer != 1 {
			t.Fatalf("sealed frame: %x from %d, %v; want %x from 1", got, srv.peer, err, p)
		}
	}

	refused := func(name string, raw []byte) {
		t.Helper()
		cl, srv := snapPipe(t, a1, a2)
		go cl.c.Write(raw)
		if _, err := srv.read(); err == nil {
			t.Fatalf("%s: a bad frame opened", name)
		}
	}
	p := appendSnapChunk(nil, 1, 1, []byte("x"))
	refused("another secret", wrong.frameSealed(nil, wrong.seal(nil, authChannelSnapshot, p)))
	tampered := a1.frameSealed(nil, a1.seal(nil, authChannelSnapshot, p))
	tampered[len(tampered)-10] ^= 1
	refused("tampered", tampered)
	refused("side-channel frame", a1.sealSide(p))

	// A replay: the same sealed frame twice on one connection.
	cl, srv = snapPipe(t, a1, a2)
	frame := a1.frameSealed(nil, a1.seal(nil, authChannelSnapshot, p))
	go cl.c.Write(append(bytes.Clone(frame), frame...))
	if _, err := srv.read(); err != nil {
		t.Fatalf("first copy: %v", err)
	}
	if _, err := srv.read(); err == nil {
		t.Fatal("a replayed frame opened")
	}
}

// TestSnapConnUnsealedBounds: an unsealed frame longer than
// snapshotFrameBytesMax is refused from its length, before its body.
func TestSnapConnUnsealedBounds(t *testing.T) {
	cl, srv := snapPipe(t, nil, nil)
	if err := cl.write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if got, err := srv.read(); err != nil || string(got) != "hello" {
		t.Fatalf("%q %v", got, err)
	}
	go cl.c.Write([]byte{0xff, 0xff, 0xff, 0x7f})
	if _, err := srv.read(); !errors.Is(err, errSnapFrame) {
		t.Fatalf("an oversized length: %v", err)
	}
}
