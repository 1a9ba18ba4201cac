package sm

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"synod/kv/proto"
)

// TestLargeValuesInBlobFiles: values of valueSeparationBytesMin and more
// go to Pebble blob files once flushed and compacted, and read back
// intact from the store, across a reopen, and from a snapshot restored
// into another store; the usage figures stay exact (overwrites of large
// values take the old value's cost off, read through its blob).
func TestLargeValuesInBlobFiles(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	a := newApplier(t, s)
	// Sizes around the threshold byte by byte, then larger ones.
	sizes := []int{valueSeparationBytesMin - 1, valueSeparationBytesMin, valueSeparationBytesMin + 1}
	for i := 3; i < 12; i++ {
		sizes = append(sizes, valueSeparationBytesMin+i*1000)
	}
	value := func(i, round int) []byte {
		return bytes.Repeat([]byte{byte(i + 16*round)}, sizes[i])
	}
	for round := range 3 { // overwrites: the usage must come off the blob-held values
		for i := range 12 {
			a.apply(1, &proto.Request{Op: proto.OpPut, Key: []byte(fmt.Sprintf("big-%02d", i)), Value: value(i, round)})
			a.apply(1, put(fmt.Sprintf("small-%02d", i), "v"))
		}
		if _, err := s.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, true); err != nil {
		t.Fatal(err)
	}
	blobs, _ := filepath.Glob(filepath.Join(dir, "*.blob"))
	if len(blobs) == 0 {
		t.Fatal("no blob file after flushing values of valueSeparationBytesMin and more")
	}
	check := func(s *SM, when string) {
		t.Helper()
		for i := range 12 {
			got, ok, err := s.Get(1, []byte(fmt.Sprintf("big-%02d", i)))
			if err != nil || !ok || !bytes.Equal(got, value(i, 2)) {
				t.Fatalf("%s: big-%02d read back %d bytes, ok %v, err %v", when, i, len(got), ok, err)
			}
		}
		checkUsageExact(t, s, when)
	}
	check(s, "after the compaction")
	before := s.Usages()
	s.Close()
	s = openT(t, dir)
	defer s.Close()
	check(s, "after reopening")

	stream, _ := snapshotBytes(t, s)
	dst := openT(t, t.TempDir())
	defer dst.Close()
	if err := dst.Restore(bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	check(dst, "restored from a snapshot")
	if got := dst.Usages(); !maps.Equal(got, before) {
		t.Fatalf("restored usage %v, had %v", got, before)
	}
	fmt.Printf("value separation: blob_files=%d values=%d..%d bytes, read back after compaction, reopen and restore\n",
		len(blobs), sizes[0], sizes[len(sizes)-1])
}

// TestOlderStoreRatchetsToValueSeparation: a store Pebble wrote at an
// older format (as a kvnode before value separation left it) opens, keeps
// its data, and is ratcheted to FormatValueSeparation.
func TestOlderStoreRatchetsToValueSeparation(t *testing.T) {
	dir := t.TempDir()
	old, err := pebble.Open(dir, &pebble.Options{DisableWAL: true, FormatMajorVersion: pebble.FormatMinSupported})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Set([]byte("written-by-an-older-pebble"), []byte("x"), pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if err := old.Flush(); err != nil {
		t.Fatal(err)
	}
	old.Close()
	s := openT(t, dir)
	defer s.Close()
	if v := s.db.FormatMajorVersion(); v < pebble.FormatValueSeparation {
		t.Fatalf("opened at format %v, want at least %v", v, pebble.FormatValueSeparation)
	}
	if _, ok, err := s.getRaw([]byte("written-by-an-older-pebble")); err != nil || !ok {
		t.Fatalf("the older store's key: ok %v, err %v", ok, err)
	}
}

// TestDeltaWithBlobValues: a delta transfer between stores whose values
// live in blob files (the fetcher's staging starts as a Pebble checkpoint,
// which must carry the blob files its tables reference) leaves the
// fetcher with exactly the server's state, and keeps the ranges nobody
// wrote since.
func TestDeltaWithBlobValues(t *testing.T) {
	smallRanges(t, 4*valueSeparationBytesMin)
	p := &deltaPair{server: openT(t, filepath.Join(t.TempDir(), "server")), fetcher: openT(t, filepath.Join(t.TempDir(), "fetcher"))}
	defer p.close()
	as, af := newApplier(t, p.server), newApplier(t, p.fetcher)
	val := func(i, v int) []byte { return bytes.Repeat([]byte{byte(i), byte(v)}, valueSeparationBytesMin/2+i) }
	for i := range 40 {
		mk := func() *proto.Request {
			return &proto.Request{Op: proto.OpPut, ClientID: 7, Key: fmt.Appendf(nil, "k-%05d", i), Value: val(i, 0)}
		}
		as.apply(1, mk())
		af.apply(1, mk())
	}
	for _, s := range []*SM{p.server, p.fetcher} {
		if _, err := s.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if blobs, _ := filepath.Glob(filepath.Join(p.fetcher.dir, "*.blob")); len(blobs) == 0 {
		t.Fatal("the fetcher holds no blob file: the test would not cover them")
	}
	for _, i := range []int{3, 17, 31} { // updates in three ranges; the rest stay
		as.apply(1, &proto.Request{Op: proto.OpPut, ClientID: 7, Key: fmt.Appendf(nil, "k-%05d", i), Value: val(i, 1)})
	}
	as.apply(1, &proto.Request{Op: proto.OpDelete, ClientID: 7, Key: []byte("k-00009")})
	st, stream, slot := p.deltaStream(t)
	p.install(t, st, stream, slot)
	kept, ranges := st.DeltaRanges()
	if kept == 0 || kept == ranges {
		t.Fatalf("kept %d of %d ranges: want some, not all", kept, ranges)
	}
	if v, ok := mustGet(t, p.fetcher, 1, "k-00017"); !ok || v != string(val(17, 1)) {
		t.Fatalf("an updated blob value after the delta: %d bytes, present %v", len(v), ok)
	}
	fmt.Printf("value separation delta: ranges=%d kept=%d delta_bytes=%d\n", ranges, kept, len(stream))
}
