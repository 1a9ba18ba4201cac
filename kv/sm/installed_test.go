package sm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// TestInstalledSlot: Installed's contract. A state that only applied
// commands reports 0, across reopens; one restored from a snapshot reports
// the snapshot's slot, across reopens and further applies; the slot never
// travels in a stream (a stream that carries it is refused); and a state
// written before the slot was recorded reports the applied slot it was
// opened with.
func TestInstalledSlot(t *testing.T) {
	srcDir := t.TempDir()
	src := openT(t, srcDir)
	a := newApplier(t, src)
	for range 20 {
		a.apply(1, put("k", "v"))
	}
	if src.Installed() != 0 {
		t.Fatalf("a new state reports installed %d, want 0", src.Installed())
	}
	src.Close()
	src = openT(t, srcDir)
	defer src.Close()
	if src.Installed() != 0 || src.Applied() != 20 {
		t.Fatalf("reopened: installed %d applied %d, want 0 and 20", src.Installed(), src.Applied())
	}

	stream := func(s *SM) []byte {
		b, _ := snapshotBytes(t, s)
		return b
	}
	dstDir := t.TempDir()
	dst := openT(t, dstDir)
	newApplier(t, dst).apply(1, put("mine", "x"))
	if err := dst.Restore(bytes.NewReader(stream(src))); err != nil {
		t.Fatal(err)
	}
	if dst.Installed() != 20 {
		t.Fatalf("restored at 20: installed %d", dst.Installed())
	}
	b := newApplier(t, dst)
	for range 5 {
		b.apply(1, put("k", "w"))
	}
	dst.Close()
	dst = openT(t, dstDir)
	if dst.Installed() != 20 || dst.Applied() != 25 {
		t.Fatalf("reopened after applying on top: installed %d applied %d, want 20 and 25", dst.Installed(), dst.Applied())
	}

	// The restored state's own stream does not carry its slot: a third
	// state restored from it reports the stream's slot, 25.
	s2 := stream(dst)
	n := 0
	if _, _, err := scanSnapshot(bytes.NewReader(s2), func(key, _ []byte) error {
		if localKey(key) {
			n++
		}
		return nil
	}); err != nil || n != 0 {
		t.Fatalf("stream of a restored state: %d local keys, %v", n, err)
	}
	third := openT(t, t.TempDir())
	defer third.Close()
	if err := third.Restore(bytes.NewReader(s2)); err != nil || third.Installed() != 25 {
		t.Fatalf("restored from a restored state: installed %d, %v; want 25", third.Installed(), err)
	}

	// A stream that carries the key is refused, the state unchanged.
	var forged bytes.Buffer
	enc := newSnapEncoder(&forged, snapshotMagic, 30)
	if err := enc.record(appliedKey, binary.BigEndian.AppendUint64(nil, 30)); err != nil {
		t.Fatal(err)
	}
	if err := enc.record(installedKey, binary.BigEndian.AppendUint64(nil, 1)); err != nil {
		t.Fatal(err)
	}
	if err := enc.end(); err != nil {
		t.Fatal(err)
	}
	if err := enc.bw.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := third.Restore(bytes.NewReader(forged.Bytes())); !errors.Is(err, ErrBadSnapshot) || third.Installed() != 25 {
		t.Fatalf("a stream carrying the installed slot: %v, installed %d; want ErrBadSnapshot and 25", err, third.Installed())
	}

	// A state from before the slot was recorded.
	if err := dst.db.Delete(installedKey, pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	dst.Close()
	dst = openT(t, dstDir)
	if dst.Installed() != 25 {
		t.Fatalf("a state without the key, applied 25: installed %d, want 25", dst.Installed())
	}
	newApplier(t, dst).apply(1, put("k", "z"))
	dst.Close()
	dst = openT(t, dstDir)
	defer dst.Close()
	if dst.Installed() != 25 || dst.Applied() != 26 {
		t.Fatalf("the bound was kept: installed %d applied %d, want 25 and 26", dst.Installed(), dst.Applied())
	}
}
