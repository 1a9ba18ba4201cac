package pmem

import (
	"bytes"
	"path/filepath"
	"testing"
	"unsafe"
)

// Every flush instruction the CPU has runs over a buffer without changing
// it (they write back cache lines; they never alter data).
func TestFlushInstructions(t *testing.T) {
	buf := make([]byte, 8192)
	for i := range buf {
		buf[i] = byte(i)
	}
	want := bytes.Clone(buf)
	start := (uintptr(unsafe.Pointer(&buf[0])) + lineBytes - 1) &^ (lineBytes - 1)
	end := start + 4096
	_, ebx7, _, _ := cpuid(7, 0)
	_, _, _, edx1 := cpuid(1, 0)
	ran := 0
	if ebx7&(1<<24) != 0 {
		flushCLWB(start, end)
		ran++
	}
	if ebx7&(1<<23) != 0 {
		flushCLFLUSHOPT(start, end)
		ran++
	}
	if edx1&(1<<19) != 0 {
		flushCLFLUSH(start, end)
		ran++
	}
	sfence()
	if !flushLines(uintptr(unsafe.Pointer(&buf[3])), 100) && FlushInstruction() != "none" {
		t.Fatal("flushLines refused with a flush instruction present")
	}
	if !bytes.Equal(buf, want) {
		t.Fatal("flushing changed the data")
	}
	t.Logf("flush instruction %s; %d of clwb/clflushopt/clflush present", FlushInstruction(), ran)
}

// The dax persist path (line flushes + SFENCE) runs a whole log life on a
// plain MAP_SHARED mapping: there it only reaches the page cache, but the
// code path is the one a DAX file takes.
func TestDAXPersistPathOnPlainMapping(t *testing.T) {
	path := filepath.Join(shmDir(t), "log")
	l, _ := mustOpen(t, testOpts(path, RegionBytesMin))
	l.r.mode = ModeDAX // the mapping lacks MAP_SYNC; only the persist path is under test
	var want []Record
	for i := range 300 {
		r := Record{Type: RecordEntry, Slot: uint64(i), Payload: pattern(uint64(i), 0, i%300)}
		if err := l.Append([]Record{r}); err != nil {
			if err := l.TruncateBelow(uint64(i)); err != nil {
				t.Fatal(err)
			}
			want = nil
			if err := l.Append([]Record{r}); err != nil {
				t.Fatal(err)
			}
		}
		want = append(want, r)
		if err := l.Persist(); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.SetPromised(Ballot{3, 3}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l, rec := mustOpen(t, testOpts(path, 0))
	defer l.Close()
	if rec.CutReason != "" || l.Promised() != (Ballot{3, 3}) {
		t.Fatalf("reopen: %+v promised %v", rec, l.Promised())
	}
	sameRecords(t, collect(t, l, 0), want)
}
