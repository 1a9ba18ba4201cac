package sm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"synod/kv/proto"
	"synod/tenants"
)

// TestRestoreAcrossManyTables: with tables of 16 KiB a restore ingests
// dozens of them, and the restored state is the source's, key for key.
func TestRestoreAcrossManyTables(t *testing.T) {
	defer func(n uint64) { restoreTableBytes = n }(restoreTableBytes)
	restoreTableBytes = 16 << 10
	src := openT(t, t.TempDir())
	defer src.Close()
	a := newApplier(t, src)
	const keys = 400
	val := func(i int) []byte { // incompressible, so tables fill at their size
		r := rand.New(rand.NewPCG(uint64(i), 1))
		b := make([]byte, 1000)
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		return b
	}
	for i := 0; i < keys; i++ {
		a.apply(tenants.ID(1+i%3), &proto.Request{Op: proto.OpPut, ClientID: 9, Key: []byte(fmt.Sprintf("key-%04d", i)), Value: val(i)})
	}
	rc, slot, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	dst := openT(t, t.TempDir())
	defer dst.Close()
	if err := dst.Restore(rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if dst.Applied() != slot {
		t.Fatalf("applied %d, want %d", dst.Applied(), slot)
	}
	for i := 0; i < keys; i++ {
		v, ok := mustGet(t, dst, tenants.ID(1+i%3), fmt.Sprintf("key-%04d", i))
		if !ok || v != string(val(i)) {
			t.Fatalf("key %d lost or wrong after restore", i)
		}
	}
	m := dst.db.Metrics()
	files := int64(0)
	for _, l := range m.Levels {
		files += l.TablesCount
	}
	if files < 10 {
		t.Fatalf("the restored state is %d tables: the restore did not roll its tables at %d bytes", files, restoreTableBytes)
	}
}

// TestRestoreRejectsUnorderedStreams: a stream whose checksum and count
// are right but whose keys are not strictly increasing (out of order, or
// a key twice) is a bad snapshot, and the state stays as it was.
func TestRestoreRejectsUnorderedStreams(t *testing.T) {
	rec := func(k string) [2][]byte { return [2][]byte{dataKey(1, []byte(k)), []byte("v")} }
	applied := [2][]byte{appliedKey, binary.BigEndian.AppendUint64(nil, 5)}
	cases := map[string][][2][]byte{
		"out of order": {applied, rec("b"), rec("a")},
		"duplicate":    {applied, rec("a"), rec("a")},
	}
	dst := openT(t, t.TempDir())
	defer dst.Close()
	newApplier(t, dst).apply(2, put("mine", "kept"))
	for name, recs := range cases {
		err := dst.Restore(bytes.NewReader(encodeStream(5, recs)))
		if !errors.Is(err, ErrBadSnapshot) {
			t.Fatalf("%s: restore error %v, want ErrBadSnapshot", name, err)
		}
		if v, ok := mustGet(t, dst, 2, "mine"); !ok || v != "kept" {
			t.Fatalf("%s: a refused snapshot changed the state (%q, %v)", name, v, ok)
		}
	}
	// The same records in order restore (the encoder is right).
	if err := dst.Restore(bytes.NewReader(encodeStream(5, [][2][]byte{applied, rec("a"), rec("b")}))); err != nil {
		t.Fatalf("ordered stream: %v", err)
	}
}

// encodeStream is a snapshot stream (snapEncoder: right count and
// checksum) of recs, in the order given.
func encodeStream(slot uint64, recs [][2][]byte) []byte {
	var out bytes.Buffer
	enc := newSnapEncoder(&out, snapshotMagic, slot)
	for _, r := range recs {
		enc.record(r[0], r[1])
	}
	enc.end()
	return out.Bytes()
}
