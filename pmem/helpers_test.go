package pmem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"testing"

	"github.com/cespare/xxhash/v2"
)

const (
	testCluster = 11
	testNode    = 3
)

// shmDir is a fresh directory under /dev/shm, removed after the test.
func shmDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("/dev/shm", "pmemtest-")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no /dev/shm under CI: %v", err)
		}
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func testOpts(path string, size int64) Options {
	return Options{Path: path, SizeBytes: size, Mode: ModeShm, ClusterID: testCluster, NodeID: testNode}
}

func mustOpen(t testing.TB, o Options) (*Log, Recovery) {
	t.Helper()
	l, rec, err := Open(o)
	if err != nil {
		t.Fatalf("open %s: %v", o.Path, err)
	}
	return l, rec
}

// pattern is the payload the tests write for slot s: n bytes derived from s
// and the ballot round, so a record from the wrong incarnation is caught.
func pattern(slot, round uint64, n int) []byte {
	b := make([]byte, n)
	var seed [16]byte
	binary.LittleEndian.PutUint64(seed[:], slot)
	binary.LittleEndian.PutUint64(seed[8:], round)
	x := xxhash.Sum64(seed[:])
	for i := range b {
		x = x*6364136223846793005 + 1442695040888963407
		b[i] = byte(x >> 56)
	}
	return b
}

// collect returns copies of every record Iterate(from) yields.
func collect(t testing.TB, l *Log, from uint64) []Record {
	t.Helper()
	var out []Record
	err := l.Iterate(from, func(r Record) error {
		r.Payload = bytes.Clone(r.Payload)
		out = append(out, r)
		return nil
	})
	if err != nil {
		t.Fatalf("iterate: %v", err)
	}
	return out
}

func sameRecords(t testing.TB, got, want []Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Type != w.Type || g.Slot != w.Slot || g.Ballot != w.Ballot || !bytes.Equal(g.Payload, w.Payload) {
			t.Fatalf("record %d: got {%v %d %v %d bytes}, want {%v %d %v %d bytes}", i,
				g.Type, g.Slot, g.Ballot, len(g.Payload), w.Type, w.Slot, w.Ballot, len(w.Payload))
		}
	}
}

// editFile applies fn to the whole region file's bytes.
func editFile(t testing.TB, path string, fn func(mem []byte)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fn(b)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// regionSeed reads the checksum seed from a region's identity line.
func regionSeed(mem []byte) uint64 {
	id, _, _ := decodeIdentity(mem)
	return id.seed
}

// restamp recomputes the checksum of the record at ring offset o, so a
// test can plant a semantically bad record the checksum does not catch.
func restamp(mem []byte, o uint64) {
	ring := mem[headerBytes:]
	n := binary.LittleEndian.Uint32(ring[o+8:])
	binary.LittleEndian.PutUint64(ring[o:], recordSum(regionSeed(mem), ring[o:o+recordHeaderBytes+uint64(n)]))
}

func isErr(err, target error) bool { return errors.Is(err, target) }
