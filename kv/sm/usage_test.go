package sm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"synod/kv/proto"
	"synod/tenants"
)

// checkUsageExact fails unless the SM's usage figures are what counting
// its keys gives; it returns the count.
func checkUsageExact(t *testing.T, s *SM, when string) map[tenants.ID]Usage {
	t.Helper()
	want, err := tallyUsage(s.db)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Usages(); !maps.Equal(got, want) {
		t.Fatalf("%s: usage %v, counting the keys gives %v", when, got, want)
	}
	stored, err := loadUsage(s.db, s.Applied())
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(stored, want) {
		t.Fatalf("%s: stored usage %v, counting the keys gives %v", when, stored, want)
	}
	return want
}

// TestUsageFigures: a key costs its user key, its value and
// KeyOverheadBytes; an overwrite replaces the old cost, a delete takes it
// off, a delete of an absent key changes nothing.
func TestUsageFigures(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	want := func(tenant tenants.ID, bytes, keys uint64) {
		t.Helper()
		if u := s.Usage(tenant); u != (Usage{Bytes: bytes, Keys: keys}) {
			t.Fatalf("tenant %d: usage %+v, want %d bytes in %d keys", tenant, u, bytes, keys)
		}
	}
	want(1, 0, 0)
	a.apply(1, put("k", "0123456789"))
	want(1, 1+10+KeyOverheadBytes, 1)
	a.apply(1, put("k", "01234"))
	want(1, 1+5+KeyOverheadBytes, 1)
	a.apply(1, put("kk", ""))
	want(1, 1+5+2+2*KeyOverheadBytes, 2)
	want(2, 0, 0)
	a.apply(1, &proto.Request{Op: proto.OpDelete, Key: []byte("absent")})
	want(1, 1+5+2+2*KeyOverheadBytes, 2)
	a.apply(1, &proto.Request{Op: proto.OpDelete, Key: []byte("k")})
	want(1, 2+KeyOverheadBytes, 1)
	a.apply(1, &proto.Request{Op: proto.OpDelete, Key: []byte("kk")})
	want(1, 0, 0)
	if _, ok, _ := s.getRaw(appendUsageKey(nil, 1)); ok {
		t.Fatal("a tenant that stores nothing keeps a usage entry")
	}
	// A CAS that fails changes nothing; one that holds replaces the value.
	a.apply(2, put("c", "abc"))
	if r := a.apply(2, &proto.Request{Op: proto.OpCAS, Key: []byte("c"), ExpectPresent: true, Expect: []byte("zzz"), Value: []byte("long value")}); r.Status != proto.StatusCASMismatch {
		t.Fatalf("CAS: %v", r.Status)
	}
	want(2, 1+3+KeyOverheadBytes, 1)
	a.apply(2, &proto.Request{Op: proto.OpCAS, Key: []byte("c"), ExpectPresent: true, Expect: []byte("abc"), Value: []byte("long value")})
	want(2, 1+10+KeyOverheadBytes, 1)
	// A BATCH that writes the same key twice and deletes another counts
	// what it leaves, not what it did.
	a.apply(2, &proto.Request{Op: proto.OpBatch, Ops: []proto.BatchOp{
		{Op: proto.OpPut, Key: []byte("b"), Value: []byte("12345678")},
		{Op: proto.OpPut, Key: []byte("b"), Value: []byte("1")},
		{Op: proto.OpDelete, Key: []byte("c")},
	}})
	want(2, 1+1+KeyOverheadBytes, 1)
	checkUsageExact(t, s, "after the figures")
}

// randomWrite returns a write of every kind in turn as rng draws it (PUT
// twice as often), over the keys and values key and value draw; a CAS
// expects what s holds for tenant now, so it holds.
func randomWrite(t *testing.T, s *SM, tenant tenants.ID, rng *rand.Rand, key, value func() []byte) *proto.Request {
	t.Helper()
	switch rng.IntN(5) {
	case 0, 1:
		return &proto.Request{Op: proto.OpPut, Key: key(), Value: value()}
	case 2:
		return &proto.Request{Op: proto.OpDelete, Key: key()}
	case 3:
		k := key()
		cur, ok, err := s.Get(tenant, k)
		if err != nil {
			t.Fatal(err)
		}
		return &proto.Request{Op: proto.OpCAS, Key: k, ExpectPresent: ok, Expect: cur, Value: value()}
	}
	req := &proto.Request{Op: proto.OpBatch}
	for j := rng.IntN(4); j >= 0; j-- {
		if rng.IntN(3) == 0 {
			req.Ops = append(req.Ops, proto.BatchOp{Op: proto.OpDelete, Key: key()})
		} else {
			req.Ops = append(req.Ops, proto.BatchOp{Op: proto.OpPut, Key: key(), Value: value()})
		}
	}
	return req
}

// TestUsageStaysExact applies a seeded mix of every write to three tenants
// and checks after each slot that the figures are what counting the keys
// gives, in memory and stored, across a reopen, a snapshot restore and
// the one-time count of a store that predates the accounting.
func TestUsageStaysExact(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	a := newApplier(t, s)
	rng := rand.New(rand.NewPCG(1, 2))
	key := func() []byte { return []byte(fmt.Sprintf("key-%02d", rng.IntN(40))) }
	value := func() []byte { return bytes.Repeat([]byte{'v'}, rng.IntN(300)) }
	for i := 0; i < 600; i++ {
		tenant := tenants.ID(1 + rng.IntN(3))
		req := randomWrite(t, s, tenant, rng, key, value)
		a.apply(tenant, req)
		checkUsageExact(t, s, fmt.Sprintf("slot %d (%v)", a.slot, req.Op))
	}
	before := checkUsageExact(t, s, "before reopening")
	if len(before) != 3 {
		t.Fatalf("usage of %d tenants, want 3", len(before))
	}
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openT(t, dir)
	if got := checkUsageExact(t, s, "after reopening"); !maps.Equal(got, before) {
		t.Fatalf("reopened with %v, had %v", got, before)
	}

	// The figures travel in a snapshot.
	rc, _, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	stream, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	dst := openT(t, t.TempDir())
	newApplier(t, dst).apply(1, put("stale", "gone after the restore"))
	if err := dst.Restore(bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	if got := checkUsageExact(t, dst, "after a restore"); !maps.Equal(got, before) {
		t.Fatalf("restored %v, had %v", got, before)
	}
	dst.Close()

	// A binary without the accounting applied a write after the entries
	// were written (a rolling upgrade): the data and the applied slot
	// moved, the entries and the marker did not. Open must not trust
	// them.
	old := s.db.NewBatch()
	old.Set(dataKey(1, []byte("written-by-an-old-binary")), make([]byte, 1000), nil)
	old.Set(appliedKey, binary.BigEndian.AppendUint64(nil, s.Applied()+1), nil)
	if err := old.Commit(pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openT(t, dir)
	after := checkUsageExact(t, s, "after an older binary applied")
	if after[1].Keys != before[1].Keys+1 {
		t.Fatalf("tenant 1 after the old binary's write: %+v, before %+v", after[1], before[1])
	}
	before = after

	// A store written before the accounting: no entries, no marker. Open
	// counts once.
	batch := s.db.NewBatch()
	batch.DeleteRange(usageKeyPrefix, prefixEnd(usageKeyPrefix), nil)
	batch.Delete(usageCountedKey, nil)
	if err := batch.Commit(pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openT(t, dir)
	defer s.Close()
	if got := checkUsageExact(t, s, "after counting an old store"); !maps.Equal(got, before) {
		t.Fatalf("counted %v, had %v", got, before)
	}
	if _, ok, _ := s.getRaw(usageCountedKey); !ok {
		t.Fatal("no marker after counting")
	}
}

// plantedUsageCaught reports whether s's usage figures differ from what
// counting its keys gives, and prints both under the planted bug's name.
func plantedUsageCaught(t *testing.T, s *SM, planted string) bool {
	t.Helper()
	want, err := tallyUsage(s.db)
	if err != nil {
		t.Fatal(err)
	}
	got := s.Usages()
	caught := !maps.Equal(got, want)
	fmt.Printf("%s: got=%v counted=%v caught=%v\n", planted, got, want, caught)
	return caught
}

// TestUsageCheckCatchesPlantedBug: the exactness check above fails when
// an overwrite forgets the old value's cost.
func TestUsageCheckCatchesPlantedBug(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	testingUsageForgetsOldValue = true
	a.apply(1, put("k", "first"))
	a.apply(1, put("k", "second"))
	testingUsageForgetsOldValue = false
	if !plantedUsageCaught(t, s, "usage check planted forgets-old-value") {
		t.Fatal("the planted accounting bug went unnoticed")
	}
}

// TestVerifySnapshotRefusesBadUsage: a snapshot's usage entries must
// decode.
func TestVerifySnapshotRefusesBadUsage(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	newApplier(t, s).apply(1, put("k", "v"))
	b := s.db.NewBatch()
	b.Set(appendUsageKey(nil, 1), []byte("short"), nil)
	if err := b.Commit(pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	rc, _, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := VerifySnapshot(rc); err == nil {
		t.Fatal("a snapshot with a 5-byte usage entry verified")
	}
}
