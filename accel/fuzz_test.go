package accel

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzPlaneApply feeds arbitrary 64-byte records to a plane as inputs
// (whatever their kind, index or values) and checks that it never panics,
// that a second plane given the same inputs emits the same outputs, and
// that the trace it wrote replays without a mismatch.
func FuzzPlaneApply(f *testing.F) {
	lt, ft := recordWorkload(f, 6, 20)
	f.Add(lt[TraceHeaderBytes:])
	f.Add(ft[TraceHeaderBytes:])
	f.Add(bytes.Repeat([]byte{0xFF}, TraceRecordBytes*3))
	f.Fuzz(func(t *testing.T, data []byte) {
		spec := DefaultSpec()
		spec.WindowSlots, spec.Replicas, spec.Quorum, spec.TenantsMax = 8, 4, 3, 4
		var tr bytes.Buffer
		a, _ := New(spec, WithTrace(&tr))
		b, _ := New(spec)
		var oa, ob []Event
		for len(data) >= TraceRecordBytes {
			in := decodeRecord(data[:TraceRecordBytes])
			data = data[TraceRecordBytes:]
			if !in.Kind.IsInput() || !in.Kind.Known() {
				continue
			}
			oa = a.Apply(oa[:0], in)
			ob = b.Apply(ob[:0], in)
			if len(oa) != len(ob) {
				t.Fatalf("planes diverged on %v: %v vs %v", in, oa, ob)
			}
			for i := range oa {
				if oa[i] != ob[i] {
					t.Fatalf("planes diverged on %v: %v vs %v", in, oa[i], ob[i])
				}
			}
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		res, err := Replay(&tr)
		if err != nil || res.Mismatches != 0 {
			t.Fatalf("replay: %+v %v", res, err)
		}
	})
}

// TestWritePlaneCorpus regenerates testdata/fuzz/FuzzPlaneApply when
// ACCEL_WRITE_CORPUS=1.
func TestWritePlaneCorpus(t *testing.T) {
	if os.Getenv("ACCEL_WRITE_CORPUS") != "1" {
		t.Skip("set ACCEL_WRITE_CORPUS=1 to regenerate the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzPlaneApply")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lt, ft := recordWorkload(t, 7, 25)
	for name, data := range map[string][]byte{"leader": lt[TraceHeaderBytes:], "follower": ft[TraceHeaderBytes:]} {
		body := "go test fuzz v1\n[]byte(" + quoteBytes(data) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
