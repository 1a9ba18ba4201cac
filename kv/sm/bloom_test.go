package sm

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"

	"synod/kv/proto"
)

// TestSSTablesHaveBloomFilters: pebbleOptions' contract is a Bloom filter
// in every sstable, so that the old-value read of a PUT to a new key does
// not search every level. Both ways an sstable comes to be are checked: a
// flush of applied writes, and a snapshot installed on another SM (which
// writes sstables itself and ingests them).
func TestSSTablesHaveBloomFilters(t *testing.T) {
	src := openT(t, t.TempDir())
	defer src.Close()
	a := newApplier(t, src)
	for i := 0; i < 200; i++ {
		a.apply(1, &proto.Request{Op: proto.OpPut, ClientID: 9, Key: fmt.Appendf(nil, "key-%04d", i), Value: bytes.Repeat([]byte{'v'}, 100)})
	}
	if _, err := src.Flush(); err != nil {
		t.Fatal(err)
	}
	want := bloom.FilterPolicy(bloomBitsPerKey).Name()
	checkFilters(t, "flushed", src.db, want)

	stream, _ := snapshotBytes(t, src)
	dst := openT(t, t.TempDir())
	defer dst.Close()
	if err := dst.Restore(bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	checkFilters(t, "installed from a snapshot", dst.db, want)
}

func checkFilters(t *testing.T, what string, db *pebble.DB, want string) {
	t.Helper()
	levels, err := db.SSTables(pebble.WithProperties())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for level, tables := range levels {
		for _, tb := range tables {
			n++
			if got := tb.Properties.FilterPolicyName; got != want {
				t.Errorf("%s: sstable %s at L%d has filter policy %q, want %q", what, tb.FileNum, level, got, want)
			}
		}
	}
	if n == 0 {
		t.Fatalf("%s: no sstables, so nothing was checked", what)
	}
}
