package replica

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"synod/paxos"
)

func TestSideFrameRoundTripAndLimit(t *testing.T) {
	var buf bytes.Buffer
	for _, p := range [][]byte{{}, []byte("hello"), bytes.Repeat([]byte{7}, 70000)} {
		if err := writeSideFrame(&buf, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []int{0, 5, 70000} {
		b, err := readSideFrame(&buf)
		if err != nil || len(b) != want {
			t.Fatalf("frame: len %d err %v, want %d", len(b), err, want)
		}
	}
	if _, err := readSideFrame(&buf); !errors.Is(err, io.EOF) {
		t.Fatalf("end: %v", err)
	}
	var hdr [4]byte
	binary.LittleEndian.PutUint32(hdr[:], sideFrameBytesMax+1)
	if _, err := readSideFrame(bytes.NewReader(hdr[:])); !errors.Is(err, errSideFrameTooLarge) {
		t.Fatalf("oversized frame: %v", err)
	}
	binary.LittleEndian.PutUint32(hdr[:], 10)
	if _, err := readSideFrame(bytes.NewReader(append(hdr[:], 1, 2, 3))); err == nil {
		t.Fatal("truncated frame accepted")
	}
}

// TestSideChannelReconnects: a peer that is down when the first message is
// sent is dialled again (bounded backoff) and later messages arrive.
func TestSideChannelReconnects(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // the peer is down for now

	got := make(chan []byte, 16)
	a, err := newSideChannel("127.0.0.1:0", map[paxos.NodeID]string{2: addr}, nil, func([]byte) {}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	a.start()
	defer a.close()
	a.send(2, []byte("lost: peer down"))
	time.Sleep(50 * time.Millisecond)

	b, err := newSideChannel(addr, nil, nil, func(p []byte) { got <- p }, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	b.start()
	defer b.close()
	deadline := time.After(10 * time.Second)
	for {
		a.send(2, []byte("hello"))
		select {
		case p := <-got:
			if string(p) != "hello" && string(p) != "lost: peer down" {
				t.Fatalf("got %q", p)
			}
			return
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("no message arrived after the peer came up")
		}
	}
}

// FuzzReadSideFrame: side-channel bytes come from the network.
func FuzzReadSideFrame(f *testing.F) {
	var buf bytes.Buffer
	writeSideFrame(&buf, []byte("abc"))
	f.Add(buf.Bytes())
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for i := 0; i < 16; i++ {
			p, err := readSideFrame(r)
			if err != nil {
				return
			}
			if len(p) > sideFrameBytesMax {
				t.Fatalf("frame of %d bytes", len(p))
			}
		}
	})
}
