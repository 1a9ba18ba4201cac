package pmem

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestRegionSizeLimits(t *testing.T) {
	dir := t.TempDir() // a disk fs: a sparse RegionBytesMax file costs nothing there
	cases := []struct {
		size int64
		ok   bool
	}{
		{RegionBytesMin - RegionAlignBytes, false},
		{RegionBytesMin + 1, false},
		{RegionBytesMin, true},
		{RegionBytesMax, true},
		{RegionBytesMax + RegionAlignBytes, false},
		{-4096, false},
	}
	// No size for a region that does not exist: "open an existing one",
	// so the error says it is missing (a crash before creating it).
	if _, _, err := Open(Options{Path: filepath.Join(dir, "missing"), Mode: ModeShm, ClusterID: 1, NodeID: 1}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing region, no size: %v, want os.ErrNotExist", err)
	}
	for i, c := range cases {
		path := filepath.Join(dir, "log"+string(rune('a'+i)))
		l, rec, err := Open(Options{Path: path, SizeBytes: c.size, Mode: ModeShm, ClusterID: 1, NodeID: 1})
		if c.ok != (err == nil) || (!c.ok && !errors.Is(err, ErrRegionSize)) {
			t.Fatalf("size %d: err %v, want ok=%v", c.size, err, c.ok)
		}
		if err != nil {
			continue
		}
		if rec.Generation != 1 {
			t.Fatalf("size %d: %+v", c.size, rec)
		}
		used, ring := l.Space()
		if used != 0 || ring != c.size-headerBytes {
			t.Fatalf("size %d: space %d/%d", c.size, used, ring)
		}
		if err := l.Append([]Record{{Type: RecordEntry, Slot: 1, Payload: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l, rec = mustOpen(t, Options{Path: path, Mode: ModeShm, ClusterID: 1, NodeID: 1})
		if rec.Records != 1 {
			t.Fatalf("size %d: reopen %+v", c.size, rec)
		}
		l.Close()
	}
}

func TestRecordSizeLimits(t *testing.T) {
	dir := shmDir(t)
	// A ring of exactly 2*RecordBytesMax holds a RecordBytesMax record
	// wherever the tail is.
	big, _ := mustOpen(t, testOpts(filepath.Join(dir, "big"), headerBytes+2*RecordBytesMax))
	defer big.Close()
	payload := pattern(1, 1, RecordPayloadBytesMax)
	for i := range 5 { // several laps: each lands at another ring offset
		if err := big.Append([]Record{{Type: RecordEntry, Slot: uint64(i), Payload: payload}}); err != nil {
			t.Fatalf("max record %d: %v", i, err)
		}
		if err := big.Persist(); err != nil {
			t.Fatal(err)
		}
		if err := big.TruncateBelow(uint64(i + 1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := big.Append([]Record{{Type: RecordEntry, Payload: make([]byte, RecordPayloadBytesMax+1)}}); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("record over RecordBytesMax: %v", err)
	}
	// In a small ring the bound is half the ring.
	small, _ := mustOpen(t, testOpts(filepath.Join(dir, "small"), RegionBytesMin))
	defer small.Close()
	half := (RegionBytesMin - headerBytes) / 2
	if err := small.Append([]Record{{Type: RecordEntry, Payload: make([]byte, half-recordHeaderBytes+1)}}); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("record over half the ring: %v", err)
	}
	for i := range 7 {
		if err := small.Append([]Record{{Type: RecordEntry, Slot: uint64(i), Payload: make([]byte, half-recordHeaderBytes)}}); err != nil {
			t.Fatalf("half-ring record %d: %v", i, err)
		}
		if err := small.Persist(); err != nil {
			t.Fatal(err)
		}
		if err := small.TruncateBelow(uint64(i + 1)); err != nil {
			t.Fatal(err)
		}
	}
	for _, typ := range []RecordType{0, RecordPad, recordTypeMax + 1} {
		if err := small.Append([]Record{{Type: typ}}); !errors.Is(err, ErrRecordType) {
			t.Fatalf("type %d: %v", typ, err)
		}
	}
}

func TestAppendBatchLimit(t *testing.T) {
	l, _ := mustOpen(t, testOpts(filepath.Join(shmDir(t), "log"), 1<<20))
	defer l.Close()
	batch := make([]Record, AppendBatchRecordsMax+1)
	for i := range batch {
		batch[i] = Record{Type: RecordEntry, Slot: uint64(i)}
	}
	if err := l.Append(batch); !errors.Is(err, ErrBatchTooLarge) {
		t.Fatalf("oversized batch: %v", err)
	}
	if err := l.Append(batch[:AppendBatchRecordsMax]); err != nil {
		t.Fatalf("batch of AppendBatchRecordsMax: %v", err)
	}
	if got := len(collect(t, l, 0)); got != AppendBatchRecordsMax {
		t.Fatalf("%d records after a full batch", got)
	}
}
