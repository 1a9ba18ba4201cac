package pmem

import (
	"path/filepath"
	"testing"
)

// TestChosenDurableAndMonotonic: NoteChosen survives a reopen, never goes
// down, rides along with later meta updates (a promise, a truncation), and
// a torn write of its copy falls back to the older copy's value. A log
// whose meta bytes 56-63 are zero (every log written before the field)
// reads 0.
func TestChosenDurableAndMonotonic(t *testing.T) {
	path := filepath.Join(shmDir(t), "log")
	l, _ := mustOpen(t, testOpts(path, 1<<20))
	if got := l.Chosen(); got != 0 {
		t.Fatalf("a new log: chosen %d, want 0", got)
	}
	for _, s := range []uint64{7, 12, 9} {
		if err := l.NoteChosen(s); err != nil {
			t.Fatal(err)
		}
	}
	if got := l.Chosen(); got != 12 {
		t.Fatalf("chosen after 7, 12, 9: %d, want 12 (it only rises)", got)
	}
	if err := l.SetPromised(Ballot{3, 1}); err != nil {
		t.Fatal(err)
	}
	if err := l.TruncateBelow(5); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l, _ = mustOpen(t, testOpts(path, 0))
	if got, b := l.Chosen(), l.Promised(); got != 12 || b != (Ballot{3, 1}) {
		t.Fatalf("after reopen: chosen %d promised %v, want 12 and {3 1}", got, b)
	}
	if err := l.NoteChosen(20); err != nil {
		t.Fatal(err)
	}
	idx := l.metaIndex
	l.Close()
	off := metaOffset0
	if idx == 1 {
		off = metaOffset1
	}
	editFile(t, path, func(mem []byte) { mem[off+57] ^= 0x10 }) // tear the newest copy's chosen bytes
	l, _ = mustOpen(t, testOpts(path, 0))
	if got := l.Chosen(); got != 12 {
		t.Fatalf("after a torn NoteChosen(20): chosen %d, want the older copy's 12", got)
	}
	l.Close()

	// A meta line written before the field: bytes 56-63 zero, checksum
	// over them as they are.
	path2 := filepath.Join(shmDir(t), "log2")
	l2, _ := mustOpen(t, testOpts(path2, 1<<20))
	if err := l2.SetPromised(Ballot{1, 1}); err != nil {
		t.Fatal(err)
	}
	l2.Close()
	l2, _ = mustOpen(t, testOpts(path2, 0))
	defer l2.Close()
	if got := l2.Chosen(); got != 0 {
		t.Fatalf("a log that never noted: chosen %d, want 0", got)
	}
}
