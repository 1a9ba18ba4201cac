package pmem

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

var (
	fuzzBaseOnce sync.Once
	fuzzBase     []byte
	fuzzBaseErr  error
)

// fuzzBaseRegion is a valid RegionBytesMin region whose ring has wrapped
// (so it holds a pad, records of two generations and stale bytes of an
// earlier lap). Fuzz inputs are laid over it.
func fuzzBaseRegion() ([]byte, error) {
	fuzzBaseOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pmemfuzz-")
		if err != nil {
			fuzzBaseErr = err
			return
		}
		defer os.RemoveAll(dir)
		saved := formatSeed
		formatSeed = func() (uint64, error) { return 0x5EED5EED5EED5EED, nil }
		defer func() { formatSeed = saved }()
		path := filepath.Join(dir, "log")
		o := Options{Path: path, SizeBytes: RegionBytesMin, Mode: ModeShm, ClusterID: testCluster, NodeID: testNode}
		for gen := 0; gen < 2; gen++ {
			l, _, err := Open(o)
			if err != nil {
				fuzzBaseErr = err
				return
			}
			for i := uint64(0); i < 40; i++ {
				s := uint64(gen)*40 + i
				r := Record{Type: RecordEntry, Slot: s, Ballot: Ballot{uint64(gen), 1}, Payload: pattern(s, 0, int(s*97%1900))}
				if err := l.Append([]Record{r}); err != nil {
					_ = l.Persist()
					_ = l.TruncateBelow(s - 3)
					if err := l.Append([]Record{r}); err != nil {
						fuzzBaseErr = err
						return
					}
				}
			}
			l.Close()
		}
		fuzzBase, fuzzBaseErr = os.ReadFile(path)
	})
	return fuzzBase, fuzzBaseErr
}

// FuzzRecover runs recovery over arbitrary region contents. Input byte 0
// picks how the rest is used:
//
//	0: laid over the ring at the offset in bytes 1-2 (times 8)
//	1: laid over the whole region (header included) at that offset
//	2: the ring is the input repeated, under a valid header
//	3: the input is the whole region
//
// Recovery must never panic, and every record it returns must pass its
// checksum and sit at its own position, inside one lap from the head.
func FuzzRecover(f *testing.F) {
	base, err := fuzzBaseRegion()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		mem := make([]byte, len(base))
		copy(mem, base)
		if len(data) >= 3 {
			off := int(binary.LittleEndian.Uint16(data[1:3])) * 8
			body := data[3:]
			switch data[0] % 4 {
			case 0:
				copy(mem[headerBytes+off%(len(mem)-headerBytes):], body)
			case 1:
				copy(mem[off%len(mem):], body)
			case 2:
				if len(body) > 0 {
					for i := headerBytes; i < len(mem); i += len(body) {
						copy(mem[i:], body)
					}
				}
			case 3:
				mem = body
			}
		}
		var seed uint64
		if len(mem) >= lineBytes {
			seed = regionSeed(mem)
		}
		st, err := recoverRegion(mem, testCluster, testNode, func(off uint64, r Record) {
			ring := mem[headerBytes:]
			h := getRecordHeader(ring[off:])
			if recordSum(seed, ring[off:off+recordHeaderBytes+uint64(len(r.Payload))]) != h.sum {
				t.Fatalf("returned a record at ring offset %d whose checksum fails", off)
			}
			if h.pos%uint64(len(ring)) != off || h.slot != r.Slot || h.typ != r.Type || r.Type == RecordPad {
				t.Fatalf("returned record at ring offset %d disagrees with its header %+v", off, h)
			}
		})
		if err != nil {
			return
		}
		n := uint64(len(mem) - headerBytes)
		if st.scan.tailPos < st.meta.headPos || st.scan.tailPos-st.meta.headPos > n {
			t.Fatalf("tail %d outside one lap of head %d (ring %d)", st.scan.tailPos, st.meta.headPos, n)
		}
		if (st.scan.cutReason == "") != (st.scan.cutBytes == 0) {
			t.Fatalf("cut %q with %d bytes", st.scan.cutReason, st.scan.cutBytes)
		}
	})
}

// TestWriteFuzzSeeds regenerates testdata/fuzz/FuzzRecover when
// PMEM_WRITE_FUZZ_SEEDS=1. The seeds it writes are committed and run by
// the normal test suite as part of FuzzRecover.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("PMEM_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set PMEM_WRITE_FUZZ_SEEDS=1 to regenerate the FuzzRecover seed corpus")
	}
	base, err := fuzzBaseRegion()
	if err != nil {
		t.Fatal(err)
	}
	ring := base[headerBytes:]
	seedFor := func(mode byte, off int, body []byte) []byte {
		b := []byte{mode, byte(off / 8), byte(off / 8 >> 8)}
		return append(b, body...)
	}
	validImage := make([]byte, 256)
	putRecord(validImage, regionSeed(base), recordHeader{typ: RecordEntry, slot: 5, pos: 0, generation: 1}, []byte("seeded"))
	seeds := map[string][]byte{
		"unchanged":         nil,
		"ring-zero-line":    seedFor(0, 0, make([]byte, 64)),
		"ring-bitflip":      seedFor(0, 8, []byte{0xFF}),
		"ring-length-huge":  seedFor(0, 8, []byte{0xFF, 0xFF, 0xFF, 0x7F}),
		"ring-valid-image":  seedFor(0, 0, validImage),
		"ring-torn-half":    seedFor(0, 32, make([]byte, 1000)),
		"header-meta0":      seedFor(1, metaOffset0, []byte{1, 2, 3}),
		"header-both-metas": seedFor(1, metaOffset0, make([]byte, 128)),
		"header-magic":      seedFor(1, 0, []byte("XXXX")),
		"ring-repeat-a5":    seedFor(2, 0, []byte{0xA5}),
		"ring-repeat-image": seedFor(2, 0, validImage[:64]),
		"raw-tiny":          seedFor(3, 0, []byte("SYNODPML")),
		"raw-header-only":   seedFor(3, 0, base[:headerBytes+64]),
		"ring-copy-of-ring": seedFor(0, 4096, ring[:2048]),
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzRecover")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range seeds {
		content := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(b)))
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkRecover64KiB times recovery of the wrapped fuzz base region.
func BenchmarkRecover64KiB(b *testing.B) {
	base, _ := fuzzBaseRegion()
	mem := make([]byte, len(base))
	for b.Loop() {
		copy(mem, base)
		recoverRegion(mem, testCluster, testNode, nil)
	}
}
