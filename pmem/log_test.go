package pmem

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestAppendPersistReopen(t *testing.T) {
	path := filepath.Join(shmDir(t), "log")
	l, rec := mustOpen(t, testOpts(path, 1<<20))
	if rec.Records != 0 || rec.CutReason != "" || rec.Generation != 1 {
		t.Fatalf("fresh log recovery = %+v", rec)
	}
	var want []Record
	for i := range 50 {
		r := Record{Type: RecordEntry, Slot: uint64(i), Ballot: Ballot{2, 1}, Payload: pattern(uint64(i), 2, i*37%700)}
		want = append(want, r)
	}
	want = append(want, Record{Type: RecordSnapshotMark, Slot: 40, Ballot: Ballot{2, 1}})
	if err := l.Append(want[:20]); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(want[20:]); err != nil {
		t.Fatal(err)
	}
	if err := l.Persist(); err != nil {
		t.Fatal(err)
	}
	sameRecords(t, collect(t, l, 0), want)
	sameRecords(t, collect(t, l, 45), want[45:50])
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(want); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	l, rec = mustOpen(t, Options{Path: path, Mode: ModeShm, ClusterID: testCluster, NodeID: testNode})
	defer l.Close()
	if rec.Records != len(want) || rec.CutReason != "" || rec.Generation != 2 {
		t.Fatalf("reopen recovery = %+v", rec)
	}
	sameRecords(t, collect(t, l, 0), want)
}

// The acceptor re-accepts a slot with a higher ballot and may accept slots
// out of order: every record comes back, in append order.
func TestReacceptAndOutOfOrder(t *testing.T) {
	path := filepath.Join(shmDir(t), "log")
	l, _ := mustOpen(t, testOpts(path, 1<<20))
	recs := []Record{
		{Type: RecordEntry, Slot: 7, Ballot: Ballot{1, 1}, Payload: []byte("a")},
		{Type: RecordEntry, Slot: 5, Ballot: Ballot{1, 1}, Payload: []byte("b")},
		{Type: RecordEntry, Slot: 7, Ballot: Ballot{3, 2}, Payload: []byte("c")},
	}
	for _, r := range recs {
		if err := l.Append([]Record{r}); err != nil {
			t.Fatal(err)
		}
		if err := l.Persist(); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	l, _ = mustOpen(t, testOpts(path, 0))
	defer l.Close()
	sameRecords(t, collect(t, l, 0), recs)
	sameRecords(t, collect(t, l, 6), []Record{recs[0], recs[2]})
}

func TestPromisedDurableAndDoubleBuffered(t *testing.T) {
	path := filepath.Join(shmDir(t), "log")
	l, _ := mustOpen(t, testOpts(path, 1<<20))
	for i := uint64(1); i <= 5; i++ {
		if err := l.SetPromised(Ballot{i, 2}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	l, _ = mustOpen(t, testOpts(path, 0))
	if got := l.Promised(); got != (Ballot{5, 2}) {
		t.Fatalf("promised after reopen = %v", got)
	}
	idx := l.metaIndex
	l.Close()
	// A torn write of the newest copy (simulated by garbling it) falls back
	// to the older copy: the ballot before the interrupted update, never a
	// mix of the two.
	off := metaOffset0
	if idx == 1 {
		off = metaOffset1
	}
	editFile(t, path, func(mem []byte) { mem[off+20] ^= 0x40 })
	l, _ = mustOpen(t, testOpts(path, 0))
	if got := l.Promised(); got != (Ballot{5, 2}) && got != (Ballot{4, 2}) {
		t.Fatalf("promised after torn meta = %v", got)
	}
	l.Close()
	// Both copies bad: refused, not guessed.
	editFile(t, path, func(mem []byte) { mem[metaOffset0+9] ^= 1; mem[metaOffset1+9] ^= 1 })
	if _, _, err := Open(testOpts(path, 0)); !errors.Is(err, ErrHeaderCorrupt) {
		t.Fatalf("open with both meta copies bad: %v", err)
	}
}

func TestTornMetaKeepsOlderBallot(t *testing.T) {
	path := filepath.Join(shmDir(t), "log")
	l, _ := mustOpen(t, testOpts(path, 1<<20))
	if err := l.SetPromised(Ballot{9, 1}); err != nil {
		t.Fatal(err)
	}
	old := l.metaIndex
	if err := l.SetPromised(Ballot{10, 1}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	newOff := metaOffset0
	if old == 0 {
		newOff = metaOffset1
	}
	// Tear the newest copy halfway: its first 32 bytes new, the rest zero.
	editFile(t, path, func(mem []byte) { clear(mem[newOff+32 : newOff+64]) })
	l, _ = mustOpen(t, testOpts(path, 0))
	defer l.Close()
	if got := l.Promised(); got != (Ballot{9, 1}) {
		t.Fatalf("promised after torn update = %v, want the older {9 1}", got)
	}
}

func TestFullNeverOverwrites(t *testing.T) {
	path := filepath.Join(shmDir(t), "log")
	l, _ := mustOpen(t, testOpts(path, RegionBytesMin))
	defer l.Close()
	var want []Record
	slot := uint64(0)
	for {
		r := Record{Type: RecordEntry, Slot: slot, Ballot: Ballot{1, 1}, Payload: pattern(slot, 1, 200)}
		err := l.Append([]Record{r})
		if err != nil {
			var fe *FullError
			if !errors.Is(err, ErrFull) || !errors.As(err, &fe) || fe.NeedBytes <= fe.FreeBytes {
				t.Fatalf("append to full log: %v", err)
			}
			break
		}
		want = append(want, r)
		slot++
	}
	if err := l.Persist(); err != nil {
		t.Fatal(err)
	}
	sameRecords(t, collect(t, l, 0), want)
	// A batch that does not fit is refused whole.
	used, _ := l.Space()
	if err := l.Append([]Record{{Type: RecordEntry, Slot: 999}}); !errors.Is(err, ErrFull) {
		t.Fatalf("append of a small record to a full log: %v", err)
	}
	if u, _ := l.Space(); u != used {
		t.Fatalf("refused append changed used bytes %d -> %d", used, u)
	}
	// Truncating frees space; the freed space is reused, wrapping the ring.
	if err := l.TruncateBelow(slot / 2); err != nil {
		t.Fatal(err)
	}
	want = want[slot/2:]
	for range slot / 3 {
		r := Record{Type: RecordEntry, Slot: slot, Ballot: Ballot{1, 1}, Payload: pattern(slot, 1, 200)}
		if err := l.Append([]Record{r}); err != nil {
			t.Fatalf("append after truncate: %v", err)
		}
		want = append(want, r)
		slot++
	}
	if err := l.Persist(); err != nil {
		t.Fatal(err)
	}
	sameRecords(t, collect(t, l, 0), want)
}

// Slots are not monotonic in the log: the head stops at the first live
// record, but Iterate never returns a truncated slot.
func TestTruncateNonMonotonic(t *testing.T) {
	path := filepath.Join(shmDir(t), "log")
	l, _ := mustOpen(t, testOpts(path, 1<<20))
	slots := []uint64{1, 2, 10, 3, 4, 11, 5}
	var recs []Record
	for _, s := range slots {
		recs = append(recs, Record{Type: RecordEntry, Slot: s, Ballot: Ballot{1, 1}, Payload: pattern(s, 1, 10)})
	}
	if err := l.Append(recs); err != nil {
		t.Fatal(err)
	}
	if err := l.Persist(); err != nil {
		t.Fatal(err)
	}
	usedBefore, _ := l.Space()
	if err := l.TruncateBelow(6); err != nil {
		t.Fatal(err)
	}
	used, _ := l.Space()
	if reclaimed := usedBefore - used; reclaimed != 2*recordBytes(10) {
		t.Fatalf("reclaimed %d bytes, want the two records before slot 10 (%d)", reclaimed, 2*recordBytes(10))
	}
	want := []Record{recs[2], recs[5]}
	sameRecords(t, collect(t, l, 0), want)
	l.Close()
	l, rec := mustOpen(t, testOpts(path, 0))
	defer l.Close()
	if rec.Records != 2 {
		t.Fatalf("recovered %d live records, want 2", rec.Records)
	}
	sameRecords(t, collect(t, l, 0), want)
	if l.TruncatedBelow() != 6 {
		t.Fatalf("truncated below = %d", l.TruncatedBelow())
	}
	// A lower truncation point is a no-op.
	if err := l.TruncateBelow(3); err != nil || l.TruncatedBelow() != 6 {
		t.Fatalf("lower truncate: %v, point %d", err, l.TruncatedBelow())
	}
}

// A model test: random appends, persists, truncations and reopens over many
// laps of a small ring, compared with a slice of what must be there.
func TestRingModel(t *testing.T) {
	path := filepath.Join(shmDir(t), "log")
	rng := rand.New(rand.NewPCG(1, 2))
	l, _ := mustOpen(t, testOpts(path, RegionBytesMin))
	var model []Record // persisted, at or above the truncation point
	var pending []Record
	low := uint64(0)
	next := uint64(0)
	laps := 0
	for step := 0; step < 3000; step++ {
		switch k := rng.IntN(10); {
		case k < 6:
			var batch []Record
			for range 1 + rng.IntN(4) {
				s := next
				if rng.IntN(5) == 0 && next > low+3 {
					s = low + rng.Uint64N(next-low) // a re-accept of an older slot
				} else {
					next++
				}
				batch = append(batch, Record{Type: RecordEntry, Slot: s, Ballot: Ballot{uint64(step), 1},
					Payload: pattern(s, uint64(step), rng.IntN(900))})
			}
			err := l.Append(batch)
			if errors.Is(err, ErrFull) {
				low = next - uint64(rng.IntN(8))
				if err := l.Persist(); err != nil {
					t.Fatal(err)
				}
				model = append(model, pending...)
				pending = nil
				if err := l.TruncateBelow(low); err != nil {
					t.Fatal(err)
				}
				kept := model[:0]
				for _, r := range model {
					if r.Slot >= low {
						kept = append(kept, r)
					}
				}
				model = kept
				laps++
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			pending = append(pending, batch...)
		case k < 8:
			if err := l.Persist(); err != nil {
				t.Fatal(err)
			}
			model = append(model, pending...)
			pending = nil
		default:
			// Reopen without persisting: in shm the stores are still in
			// the file, so Close persisting them matches a process that
			// persisted; what matters is that nothing is invented or lost.
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			model = append(model, pending...)
			pending = nil
			var rec Recovery
			l, rec = mustOpen(t, testOpts(path, 0))
			if rec.CutReason != "" {
				t.Fatalf("step %d: clean reopen cut the log: %+v", step, rec)
			}
		}
		var want []Record
		for _, r := range append(append([]Record(nil), model...), pending...) {
			if r.Slot >= low {
				want = append(want, r)
			}
		}
		sameRecords(t, collect(t, l, 0), want)
	}
	l.Close()
	if laps < 10 {
		t.Fatalf("model test wrapped the ring only %d times", laps)
	}
}

func TestHeaderChecks(t *testing.T) {
	dir := shmDir(t)
	path := filepath.Join(dir, "log")
	l, _ := mustOpen(t, testOpts(path, RegionBytesMin))
	l.Close()
	o := testOpts(path, 0)
	o.NodeID = 4
	if _, _, err := Open(o); !errors.Is(err, ErrIdentity) {
		t.Fatalf("open as another node: %v", err)
	}
	o = testOpts(path, 0)
	o.ClusterID = 12
	if _, _, err := Open(o); !errors.Is(err, ErrIdentity) {
		t.Fatalf("open as another cluster: %v", err)
	}
	if _, _, err := Open(testOpts(path, 2*RegionBytesMin)); !errors.Is(err, ErrRegionSize) {
		t.Fatalf("open with another size: %v", err)
	}
	editFile(t, path, func(mem []byte) { mem[8] = 9; restampIdentity(mem) })
	if _, _, err := Open(testOpts(path, 0)); !errors.Is(err, ErrVersion) {
		t.Fatalf("open of version 9: %v", err)
	}
	editFile(t, path, func(mem []byte) { mem[8] = 1; mem[20] ^= 1 })
	if _, _, err := Open(testOpts(path, 0)); !errors.Is(err, ErrHeaderCorrupt) {
		t.Fatalf("open with corrupt identity: %v", err)
	}
	editFile(t, path, func(mem []byte) { copy(mem, "NOTALOG!") })
	if _, _, err := Open(testOpts(path, 0)); !errors.Is(err, ErrNotLog) {
		t.Fatalf("open of a foreign file: %v", err)
	}
	// A blank header is formatted again.
	editFile(t, path, func(mem []byte) { clear(mem[:headerBytes]) })
	l, rec := mustOpen(t, testOpts(path, 0))
	l.Close()
	if rec.Generation != 1 || rec.Records != 0 {
		t.Fatalf("reformat recovery = %+v", rec)
	}
	// A zero magic on a log that was opened before is a fault, not an
	// interrupted format: refused.
	editFile(t, path, func(mem []byte) { clear(mem[:8]) })
	if _, _, err := Open(testOpts(path, 0)); !errors.Is(err, ErrHeaderCorrupt) {
		t.Fatalf("open of a used log with its magic zeroed: %v", err)
	}
	if _, _, err := Open(Options{Path: path, Mode: "fast"}); err == nil || !strings.Contains(err.Error(), "unknown mode") {
		t.Fatalf("open with unknown mode: %v", err)
	}
}

func restampIdentity(mem []byte) {
	id, _, _ := decodeIdentity(mem)
	encodeIdentity(mem, id)
}

func TestDAXRefusedNamesFix(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log")
	if m, err := DetectMode(path); err != nil || m == ModeDAX {
		t.Skipf("%s is on a DAX filesystem (or detection failed: %v): refusal not testable here", dir, err)
	}
	_, _, err := Open(Options{Path: path, SizeBytes: RegionBytesMin, Mode: ModeDAX, ClusterID: 1, NodeID: 1})
	if !errors.Is(err, ErrDAXUnavailable) || !strings.Contains(err.Error(), `"msync"`) || !strings.Contains(err.Error(), "-o dax") {
		t.Fatalf("dax on a non-DAX fs: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("refused dax open left %s behind: %v", path, err)
	}
}

func TestDetectMode(t *testing.T) {
	if m, err := DetectMode(filepath.Join(shmDir(t), "log")); err != nil || m != ModeShm {
		t.Fatalf("detect on /dev/shm = %q, %v", m, err)
	}
	m, err := DetectMode(filepath.Join(t.TempDir(), "log"))
	if err != nil || (m != ModeMsync && m != ModeDAX) {
		t.Fatalf("detect on a disk fs = %q, %v", m, err)
	}
	path := filepath.Join(shmDir(t), "log")
	l, _ := mustOpen(t, Options{Path: path, SizeBytes: RegionBytesMin, Mode: ModeDetect, ClusterID: 1, NodeID: 1})
	defer l.Close()
	if l.Mode() != ModeShm {
		t.Fatalf("detected mode %q on /dev/shm", l.Mode())
	}
}

func TestMsyncMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	o := Options{Path: path, SizeBytes: RegionBytesMin, Mode: ModeMsync, ClusterID: 1, NodeID: 1}
	l, _ := mustOpen(t, o)
	recs := []Record{{Type: RecordEntry, Slot: 1, Ballot: Ballot{1, 1}, Payload: pattern(1, 1, 5000)}}
	for i := range 40 { // enough 5 KB records to wrap the 60 KiB ring
		recs[0].Slot = uint64(i)
		if err := l.Append(recs); errors.Is(err, ErrFull) {
			if err := l.TruncateBelow(uint64(i)); err != nil {
				t.Fatal(err)
			}
			if err := l.Append(recs); err != nil {
				t.Fatal(err)
			}
		} else if err != nil {
			t.Fatal(err)
		}
		if err := l.Persist(); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.SetPromised(Ballot{4, 4}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l, rec := mustOpen(t, Options{Path: path, Mode: ModeMsync, ClusterID: 1, NodeID: 1})
	defer l.Close()
	got := collect(t, l, 0)
	if rec.CutReason != "" || len(got) == 0 || got[len(got)-1].Slot != 39 || l.Promised() != (Ballot{4, 4}) {
		t.Fatalf("msync reopen: %+v, %d records, promised %v", rec, len(got), l.Promised())
	}
}

// A crash between creating the file and sizing it leaves an empty file;
// Open sizes and formats it.
func TestEmptyFileIsFormatted(t *testing.T) {
	path := filepath.Join(shmDir(t), "log")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l, rec := mustOpen(t, testOpts(path, RegionBytesMin))
	defer l.Close()
	if rec.Generation != 1 {
		t.Fatalf("recovery of an empty file: %+v", rec)
	}
}

// A format interrupted before the magic reached the media (every other
// header byte durable, or any subset of them) is formatted again.
func TestInterruptedFormat(t *testing.T) {
	dir := shmDir(t)
	src := filepath.Join(dir, "src")
	var formatted []byte
	persistHook = func(r *region, off, n int64) {
		if formatted == nil && off == 0 && n == headerBytes {
			formatted = bytes.Clone(r.mem[:headerBytes]) // the state before the magic store
		}
	}
	l, _ := mustOpen(t, testOpts(src, RegionBytesMin))
	persistHook = nil
	l.Close()
	if formatted == nil || !allZero(formatted[:8]) {
		t.Fatal("format did not persist the header before the magic")
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 50 {
		path := filepath.Join(dir, fmt.Sprintf("log%d", i))
		img := make([]byte, RegionBytesMin)
		for w := 0; w < headerBytes; w += 8 { // a random subset of the words
			if i == 0 || rng.IntN(2) == 0 {
				copy(img[w:w+8], formatted[w:w+8])
			}
		}
		if err := os.WriteFile(path, img, 0o600); err != nil {
			t.Fatal(err)
		}
		l, rec, err := Open(testOpts(path, 0))
		if err != nil {
			t.Fatalf("image %d: %v", i, err)
		}
		l.Close()
		if rec.Generation != 1 {
			t.Fatalf("image %d: %+v", i, rec)
		}
	}
}

// BenchmarkAppendPersistShm is one 512-byte record appended and persisted
// in shm mode (a store fence): the log's own CPU cost.
func BenchmarkAppendPersistShm(b *testing.B) {
	l, _ := mustOpen(b, testOpts(filepath.Join(shmDir(b), "log"), 16<<20))
	defer l.Close()
	rec := []Record{{Type: RecordEntry, Ballot: Ballot{1, 1}, Payload: make([]byte, 512)}}
	b.ReportAllocs()
	for i := uint64(0); b.Loop(); i++ {
		rec[0].Slot = i
		if err := l.Append(rec); errors.Is(err, ErrFull) {
			if err := l.TruncateBelow(i); err != nil {
				b.Fatal(err)
			}
			if err := l.Append(rec); err != nil {
				b.Fatal(err)
			}
		} else if err != nil {
			b.Fatal(err)
		}
		if err := l.Persist(); err != nil {
			b.Fatal(err)
		}
	}
}

func TestSecondOpenRefused(t *testing.T) {
	path := filepath.Join(shmDir(t), "log")
	l, _ := mustOpen(t, testOpts(path, RegionBytesMin))
	if _, _, err := Open(testOpts(path, 0)); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open of a log in use: %v", err)
	}
	l.Close()
	l, _ = mustOpen(t, testOpts(path, 0))
	l.Close()
}

// TestOpenWaitsForTheLock: with LockWait, an Open that finds the log in
// use opens it once the holder closes it within the wait (a restart right
// after its predecessor was killed), and is refused with ErrLocked once
// the wait has passed while the holder stays.
func TestOpenWaitsForTheLock(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the lock is taken on Linux only")
	}
	path := filepath.Join(shmDir(t), "log")
	holder, _ := mustOpen(t, testOpts(path, RegionBytesMin))
	opts := testOpts(path, 0)
	opts.LockWait = 150 * time.Millisecond
	start := time.Now()
	if _, _, err := Open(opts); !errors.Is(err, ErrLocked) {
		t.Fatalf("an open while the holder stays: %v, want ErrLocked", err)
	}
	if took := time.Since(start); took < opts.LockWait {
		t.Fatalf("refused after %v, before the wait of %v passed", took, opts.LockWait)
	}
	opts.LockWait = 10 * time.Second
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		released <- time.Now()
		holder.Close()
	}()
	l, _, err := Open(opts)
	if err != nil {
		t.Fatalf("an open waiting %v for a holder that closed after 200 ms: %v", opts.LockWait, err)
	}
	if at := <-released; time.Now().Before(at) {
		t.Fatal("opened before the holder let go")
	}
	l.Close()
}
