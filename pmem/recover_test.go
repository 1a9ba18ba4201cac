package pmem

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// fixture is a region file holding records written and persisted by one
// incarnation, with their ring offsets.
type fixture struct {
	path string
	recs []Record
	offs []uint64
	mem  []byte // the file's bytes after a clean close
}

func newFixture(t *testing.T, payloads ...int) fixture {
	t.Helper()
	fx := fixture{path: filepath.Join(shmDir(t), "log")}
	l, _ := mustOpen(t, testOpts(fx.path, RegionBytesMin))
	off := uint64(0)
	for i, n := range payloads {
		r := Record{Type: RecordEntry, Slot: uint64(100 + i), Ballot: Ballot{5, 2}, Payload: pattern(uint64(100+i), 5, n)}
		if err := l.Append([]Record{r}); err != nil {
			t.Fatal(err)
		}
		fx.recs = append(fx.recs, r)
		fx.offs = append(fx.offs, off)
		off += uint64(recordBytes(n))
	}
	if err := l.Persist(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var err error
	if fx.mem, err = os.ReadFile(fx.path); err != nil {
		t.Fatal(err)
	}
	return fx
}

// tail is the ring offset after the last record.
func (fx fixture) tail() uint64 {
	last := len(fx.recs) - 1
	return fx.offs[last] + uint64(recordBytes(len(fx.recs[last].Payload)))
}

// recoverBytes runs recovery on a copy of mem and returns the records it
// keeps (copied) and its result.
func recoverBytes(t *testing.T, mem []byte) ([]Record, regionState, error) {
	t.Helper()
	var out []Record
	st, err := recoverRegion(bytes.Clone(mem), testCluster, testNode, func(_ uint64, r Record) {
		r.Payload = bytes.Clone(r.Payload)
		out = append(out, r)
	})
	return out, st, err
}

// expectCut checks that recovery of mem keeps exactly keep and reports
// reason ("" for a clean end).
func expectCut(t *testing.T, mem []byte, keep []Record, reason string) {
	t.Helper()
	got, st, err := recoverBytes(t, mem)
	if err != nil {
		t.Fatalf("recovery: %v", err)
	}
	if st.scan.cutReason != reason {
		t.Fatalf("cut reason %q, want %q", st.scan.cutReason, reason)
	}
	if reason != "" && st.scan.cutBytes <= 0 {
		t.Fatalf("cut %q with CutBytes %d", reason, st.scan.cutBytes)
	}
	sameRecords(t, got, keep)
}

// ringAt is the ring slice at offset o of a region's bytes.
func ringAt(mem []byte, o uint64) []byte { return mem[headerBytes+o:] }

// plant writes a valid record (checksum right) with the given header at
// ring offset o.
func plant(mem []byte, o uint64, h recordHeader, payload []byte) {
	putRecord(ringAt(mem, o), regionSeed(mem), h, payload)
}

func TestRecoveryDecisionTable(t *testing.T) {
	n := uint64(RegionBytesMin - headerBytes)
	t.Run("1 ring full", func(t *testing.T) {
		path := filepath.Join(shmDir(t), "log")
		l, _ := mustOpen(t, testOpts(path, RegionBytesMin))
		var recs []Record
		for i := range n / recordAlignBytes {
			r := Record{Type: RecordEntry, Slot: i, Payload: pattern(i, 0, 8)}
			if err := l.Append([]Record{r}); err != nil {
				t.Fatalf("record %d: %v", i, err)
			}
			recs = append(recs, r)
		}
		if err := l.Append([]Record{{Type: RecordEntry}}); !errors.Is(err, ErrFull) {
			t.Fatalf("append to a full ring: %v", err)
		}
		l.Close()
		l, rec := mustOpen(t, testOpts(path, 0))
		defer l.Close()
		if rec.CutReason != "" || rec.Records != len(recs) {
			t.Fatalf("full ring recovery %+v", rec)
		}
		sameRecords(t, collect(t, l, 0), recs)
	})
	t.Run("2 zero line", func(t *testing.T) {
		fx := newFixture(t, 10, 100, 1000)
		expectCut(t, fx.mem, fx.recs, "")
		// Stale non-zero bytes after the end marker do not matter.
		mem := bytes.Clone(fx.mem)
		copy(ringAt(mem, fx.tail()+lineBytes), bytes.Repeat([]byte{0xA5}, 500))
		expectCut(t, mem, fx.recs, "")
	})
	t.Run("3 bad length", func(t *testing.T) {
		fx := newFixture(t, 10, 100, 1000)
		for _, bad := range []uint32{RecordPayloadBytesMax + 1, uint32(n), 0xFFFFFFFF} {
			mem := bytes.Clone(fx.mem)
			putU32(ringAt(mem, fx.offs[1])[8:], bad)
			expectCut(t, mem, fx.recs[:1], CutBadLength)
		}
		mem := bytes.Clone(fx.mem)
		ringAt(mem, fx.offs[2])[12] = byte(RecordPad) // a pad with a length
		expectCut(t, mem, fx.recs[:2], CutBadLength)
	})
	t.Run("4 checksum", func(t *testing.T) {
		fx := newFixture(t, 10, 100, 1000)
		mem := bytes.Clone(fx.mem)
		ringAt(mem, fx.offs[2])[recordHeaderBytes+500] ^= 0x08
		expectCut(t, mem, fx.recs[:2], CutChecksum)
	})
	t.Run("5 stale lap", func(t *testing.T) {
		// Wrap the ring once, then put a valid record of the lap before at
		// the tail, where the end marker was.
		path := filepath.Join(shmDir(t), "log")
		l, _ := mustOpen(t, testOpts(path, RegionBytesMin))
		var live []Record
		for i := uint64(0); l.tailPos < n+n/2; i++ {
			r := Record{Type: RecordEntry, Slot: i, Payload: pattern(i, 0, 900)}
			if err := l.Append([]Record{r}); errors.Is(err, ErrFull) {
				if err := l.Persist(); err != nil {
					t.Fatal(err)
				}
				if err := l.TruncateBelow(i); err != nil {
					t.Fatal(err)
				}
				live = nil
				if err := l.Append([]Record{r}); err != nil {
					t.Fatal(err)
				}
			}
			live = append(live, r)
		}
		p := l.tailPos
		l.Close()
		mem, _ := os.ReadFile(path)
		plant(mem, p%n, recordHeader{typ: RecordEntry, slot: 1, pos: p - n, generation: 1}, []byte("old"))
		expectCut(t, mem, live, "")
		plant(mem, p%n, recordHeader{typ: RecordEntry, slot: 1, pos: p - n + 64, generation: 1}, []byte("old"))
		expectCut(t, mem, live, CutBadPosition)
	})
	t.Run("6 bad position", func(t *testing.T) {
		fx := newFixture(t, 10, 100)
		mem := bytes.Clone(fx.mem)
		plant(mem, fx.tail(), recordHeader{typ: RecordEntry, slot: 1, pos: fx.tail() + n, generation: 1}, []byte("x"))
		expectCut(t, mem, fx.recs, CutBadPosition)
		mem = bytes.Clone(fx.mem)
		plant(mem, fx.tail(), recordHeader{typ: RecordEntry, slot: 1, pos: fx.tail() - 64, generation: 1}, []byte("x"))
		expectCut(t, mem, fx.recs, CutBadPosition)
	})
	t.Run("7 stale generation", func(t *testing.T) {
		// Records of generation 2 after records of generation 1; a
		// generation-1 record after them is a leftover of the incarnation
		// before (written beyond a tail that recovery cut).
		fx := newFixture(t, 10)
		l, _ := mustOpen(t, testOpts(fx.path, 0))
		r := Record{Type: RecordEntry, Slot: 200, Ballot: Ballot{6, 1}, Payload: []byte("gen2")}
		if err := l.Append([]Record{r}); err != nil {
			t.Fatal(err)
		}
		l.Close()
		mem, _ := os.ReadFile(fx.path)
		tail := fx.tail() + uint64(recordBytes(4))
		plant(mem, tail, recordHeader{typ: RecordEntry, slot: 201, pos: tail, generation: 1}, []byte("stale"))
		expectCut(t, mem, []Record{fx.recs[0], r}, "")
	})
	t.Run("8 generation from the future", func(t *testing.T) {
		fx := newFixture(t, 10)
		mem := bytes.Clone(fx.mem)
		plant(mem, fx.tail(), recordHeader{typ: RecordEntry, slot: 1, pos: fx.tail(), generation: 99}, nil)
		expectCut(t, mem, fx.recs, CutGenerationNew)
	})
	t.Run("9 reserved bytes", func(t *testing.T) {
		fx := newFixture(t, 10, 20)
		mem := bytes.Clone(fx.mem)
		ringAt(mem, fx.offs[1])[14] = 1
		restamp(mem, fx.offs[1])
		expectCut(t, mem, fx.recs[:1], CutReserved)
	})
	t.Run("10 unknown type", func(t *testing.T) {
		fx := newFixture(t, 10, 20)
		for _, typ := range []byte{0, byte(recordTypeMax) + 1, 0xFF} {
			mem := bytes.Clone(fx.mem)
			ringAt(mem, fx.offs[1])[12] = typ
			restamp(mem, fx.offs[1])
			expectCut(t, mem, fx.recs[:1], CutUnknownType)
		}
	})
	t.Run("11 pad and 12 valid across a wrap", func(t *testing.T) {
		path := filepath.Join(shmDir(t), "log")
		l, _ := mustOpen(t, testOpts(path, RegionBytesMin))
		var live []Record
		for i := uint64(0); i < 200; i++ {
			r := Record{Type: RecordEntry, Slot: i, Payload: pattern(i, 0, 1500)}
			if err := l.Append([]Record{r}); errors.Is(err, ErrFull) {
				if err := l.Persist(); err != nil {
					t.Fatal(err)
				}
				if err := l.TruncateBelow(i - 5); err != nil {
					t.Fatal(err)
				}
				live = live[len(live)-5:]
				if err := l.Append([]Record{r}); err != nil {
					t.Fatal(err)
				}
			}
			live = append(live, r)
		}
		l.Close()
		mem, _ := os.ReadFile(path)
		pads := 0
		for o := uint64(0); o < n; o += recordAlignBytes {
			if h := getRecordHeader(ringAt(mem, o)); h.typ == RecordPad && recordSum(regionSeed(mem), ringAt(mem, o)[:recordHeaderBytes]) == h.sum {
				pads++
			}
		}
		if pads == 0 {
			t.Fatal("no pad record in a wrapped ring")
		}
		l, rec := mustOpen(t, testOpts(path, 0))
		defer l.Close()
		if rec.CutReason != "" {
			t.Fatalf("wrapped ring recovery %+v", rec)
		}
		sameRecords(t, collect(t, l, 0), live)
	})
}

func putU32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// After a real cut, the next incarnation writes over the cut tail; bytes
// the old incarnation left beyond it never come back, even when the new
// incarnation's end marker did not reach the media.
func TestCutThenRewriteNeverResurrects(t *testing.T) {
	fx := newFixture(t, 100, 100, 100)
	editFile(t, fx.path, func(mem []byte) { ringAt(mem, fx.offs[1])[recordHeaderBytes+3] ^= 1 })
	l, rec := mustOpen(t, testOpts(fx.path, 0))
	if rec.CutReason != CutChecksum || rec.Records != 1 {
		t.Fatalf("recovery after a flipped bit: %+v", rec)
	}
	d := Record{Type: RecordEntry, Slot: 300, Ballot: Ballot{7, 1}, Payload: pattern(300, 7, 100)}
	if err := l.Append([]Record{d}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	// Put the third record back as it was, as if the end marker after d
	// never reached the media.
	editFile(t, fx.path, func(mem []byte) {
		copy(ringAt(mem, fx.offs[2])[:recordBytes(100)], ringAt(fx.mem, fx.offs[2])[:recordBytes(100)])
	})
	l, rec = mustOpen(t, testOpts(fx.path, 0))
	defer l.Close()
	if rec.CutReason != "" {
		t.Fatalf("recovery: %+v", rec)
	}
	sameRecords(t, collect(t, l, 0), []Record{fx.recs[0], d})
}

// A cut is reported by the first Open after it; that Open replaces the
// cut tail with an end marker.
func TestCutReportedOnce(t *testing.T) {
	fx := newFixture(t, 100, 100)
	editFile(t, fx.path, func(mem []byte) { ringAt(mem, fx.offs[1])[20] ^= 1 })
	l, rec := mustOpen(t, testOpts(fx.path, 0))
	l.Close()
	if rec.CutReason != CutChecksum || rec.CutBytes != recordBytes(100) {
		t.Fatalf("first open: %+v", rec)
	}
	l, rec = mustOpen(t, testOpts(fx.path, 0))
	defer l.Close()
	if rec.CutReason != "" || rec.Records != 1 {
		t.Fatalf("second open: %+v", rec)
	}
}

// Every single-bit flip in a record's header or payload is detected: the
// record and everything after it is cut, everything before it is intact.
func TestBitFlipInjection(t *testing.T) {
	fx := newFixture(t, 30, 200, 700)
	rng := rand.New(rand.NewPCG(3, 4))
	for victim := range fx.recs {
		span := recordHeaderBytes + len(fx.recs[victim].Payload)
		for i := 0; i < span; i++ {
			mem := bytes.Clone(fx.mem)
			ringAt(mem, fx.offs[victim])[i] ^= 1 << rng.IntN(8)
			got, st, err := recoverBytes(t, mem)
			if err != nil {
				t.Fatal(err)
			}
			if st.scan.cutReason == "" {
				t.Fatalf("record %d byte %d: flip not detected", victim, i)
			}
			sameRecords(t, got, fx.recs[:victim])
		}
	}
	// Flips in the padding after a payload are outside the checksum and
	// harmless: the record is unchanged.
	mem := bytes.Clone(fx.mem)
	ringAt(mem, fx.offs[0])[recordHeaderBytes+30] ^= 0xFF
	expectCut(t, mem, fx.recs, "")
	// A flip in the identity line refuses the region; in one meta copy it
	// falls back to the other.
	for i := 0; i < lineBytes; i++ {
		mem := bytes.Clone(fx.mem)
		mem[identityOffset+i] ^= 1 << rng.IntN(8)
		if _, _, err := recoverBytes(t, mem); err == nil {
			t.Fatalf("identity byte %d flipped: accepted", i)
		}
		mem = bytes.Clone(fx.mem)
		mem[metaOffset0+i] ^= 1 << rng.IntN(8)
		mem[metaOffset1+(i+7)%lineBytes] ^= 0
		if _, st, err := recoverBytes(t, mem); err != nil && !errors.Is(err, ErrHeaderCorrupt) {
			t.Fatalf("meta byte %d flipped: %v", i, err)
		} else if err == nil && st.meta.generation == 0 {
			t.Fatalf("meta byte %d flipped: fell back to a copy that never was newest", i)
		}
	}
}

// A torn write of the last record: only its first k bytes reached the
// media; the rest is zero or stale bytes of an earlier lap. It is returned
// only when complete.
func TestTornTail(t *testing.T) {
	fx := newFixture(t, 50, 450)
	lastOff := fx.offs[1]
	full := recordHeaderBytes + len(fx.recs[1].Payload)
	rng := rand.New(rand.NewPCG(5, 6))
	stale := make([]byte, recordBytes(450)+lineBytes)
	for i := range stale {
		stale[i] = byte(rng.Uint32())
	}
	for k := 0; k <= full; k++ {
		for _, rest := range []string{"zero", "stale"} {
			mem := bytes.Clone(fx.mem)
			tail := ringAt(mem, lastOff)[k:recordBytes(450)]
			if rest == "zero" {
				clear(tail)
			} else {
				copy(tail, stale[k:])
			}
			got, st, err := recoverBytes(t, mem)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case k == full:
				sameRecords(t, got, fx.recs)
			case allZero(ringAt(mem, lastOff)[:lineBytes]):
				sameRecords(t, got, fx.recs[:1]) // nothing of it reached the media: a clean end
			default:
				if st.scan.cutReason == "" {
					t.Fatalf("k=%d rest=%s: torn record not reported", k, rest)
				}
				sameRecords(t, got, fx.recs[:1])
			}
		}
	}
	// A zeroed tail from inside a record on: cut. From a record's start:
	// indistinguishable from the end of the log (see recover.go).
	mem := bytes.Clone(fx.mem)
	clear(ringAt(mem, lastOff)[100:])
	expectCut(t, mem, fx.recs[:1], CutChecksum)
	mem = bytes.Clone(fx.mem)
	clear(ringAt(mem, lastOff))
	expectCut(t, mem, fx.recs[:1], "")
}
