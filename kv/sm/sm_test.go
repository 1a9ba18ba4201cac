package sm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/tenants"
)

// snapshotBytes reads a whole snapshot stream of s and its slot.
func snapshotBytes(t *testing.T, s *SM) ([]byte, uint64) {
	t.Helper()
	rc, slot, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b, slot
}

func openT(t *testing.T, dir string) *SM {
	t.Helper()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// applier numbers slots and writes for a test.
type applier struct {
	t    *testing.T
	s    *SM
	seq  map[uint64]uint64
	slot uint64
}

func newApplier(t *testing.T, s *SM) *applier {
	return &applier{t: t, s: s, seq: map[uint64]uint64{}, slot: s.Applied()}
}

func (a *applier) apply(tenant tenants.ID, req *proto.Request) Result {
	a.t.Helper()
	if req.ClientID == 0 {
		req.ClientID = 1
	}
	if req.Seq == 0 {
		a.seq[req.ClientID]++
		req.Seq = a.seq[req.ClientID]
	}
	if req.FirstUnacked == 0 {
		req.FirstUnacked = req.Seq
	}
	a.slot++
	res, err := a.s.Apply(a.slot, [][]byte{EncodeCommand(tenant, req)})
	if err != nil {
		a.t.Fatal(err)
	}
	return res[0]
}

func put(k, v string) *proto.Request {
	return &proto.Request{Op: proto.OpPut, Key: []byte(k), Value: []byte(v)}
}

func mustGet(t *testing.T, s *SM, tenant tenants.ID, key string) (string, bool) {
	t.Helper()
	v, ok, err := s.Get(tenant, []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return string(v), ok
}

func TestPutGetDelete(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	if r := a.apply(1, put("k", "v1")); r.Status != proto.StatusOK {
		t.Fatalf("put: %v", r.Status)
	}
	if v, ok := mustGet(t, s, 1, "k"); !ok || v != "v1" {
		t.Fatalf("get = %q,%v", v, ok)
	}
	a.apply(1, put("k", "v2"))
	if v, _ := mustGet(t, s, 1, "k"); v != "v2" {
		t.Fatalf("get after overwrite = %q", v)
	}
	a.apply(1, put("empty", ""))
	if v, ok := mustGet(t, s, 1, "empty"); !ok || v != "" {
		t.Fatalf("empty value: %q,%v", v, ok)
	}
	a.apply(1, &proto.Request{Op: proto.OpDelete, Key: []byte("k")})
	if _, ok := mustGet(t, s, 1, "k"); ok {
		t.Fatal("key present after delete")
	}
	if r := a.apply(1, &proto.Request{Op: proto.OpDelete, Key: []byte("absent")}); r.Status != proto.StatusOK {
		t.Fatalf("delete of absent key: %v", r.Status)
	}
	if s.Applied() != a.slot {
		t.Fatalf("applied %d, want %d", s.Applied(), a.slot)
	}
}

func TestCAS(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	cas := func(key string, expect *string, value string) Result {
		req := &proto.Request{Op: proto.OpCAS, Key: []byte(key), Value: []byte(value)}
		if expect != nil {
			req.ExpectPresent, req.Expect = true, []byte(*expect)
		}
		return a.apply(1, req)
	}
	str := func(s string) *string { return &s }
	if r := cas("k", nil, "a"); r.Status != proto.StatusOK {
		t.Fatalf("create-if-absent: %v", r.Status)
	}
	if r := cas("k", nil, "b"); r.Status != proto.StatusCASMismatch || !r.HasValue || string(r.Value) != "a" {
		t.Fatalf("create-if-absent on present key: %+v", r)
	}
	if r := cas("k", str("x"), "b"); r.Status != proto.StatusCASMismatch || string(r.Value) != "a" {
		t.Fatalf("wrong expect: %+v", r)
	}
	if r := cas("k", str("a"), "b"); r.Status != proto.StatusOK {
		t.Fatalf("right expect: %v", r.Status)
	}
	if v, _ := mustGet(t, s, 1, "k"); v != "b" {
		t.Fatalf("value %q after CAS", v)
	}
	if r := cas("absent", str(""), "z"); r.Status != proto.StatusCASMismatch || r.HasValue {
		t.Fatalf("expect empty on absent key: %+v", r)
	}
	// A digest condition compares SHA-256 of the current value.
	digest := func(key string, of string, value string) Result {
		return a.apply(1, &proto.Request{Op: proto.OpCAS, Key: []byte(key), Value: []byte(value),
			ExpectPresent: true, ExpectDigest: true, Expect: proto.ValueDigest([]byte(of))})
	}
	if r := digest("k", "a", "c"); r.Status != proto.StatusCASMismatch || string(r.Value) != "b" {
		t.Fatalf("digest of another value: %+v", r)
	}
	if r := digest("absent", "", "c"); r.Status != proto.StatusCASMismatch || r.HasValue {
		t.Fatalf("digest of the empty value on an absent key: %+v", r)
	}
	if r := digest("k", "b", "c"); r.Status != proto.StatusOK {
		t.Fatalf("digest of the current value: %+v", r)
	}
	if v, _ := mustGet(t, s, 1, "k"); v != "c" {
		t.Fatalf("value %q after a digest CAS", v)
	}
	// The digest, not the bytes: a condition naming a 32-byte value itself
	// as if it were its digest does not match.
	v32 := strings.Repeat("v", proto.ExpectDigestBytes)
	a.apply(1, put("k32", v32))
	if r := a.apply(1, &proto.Request{Op: proto.OpCAS, Key: []byte("k32"), Value: []byte("d"),
		ExpectPresent: true, ExpectDigest: true, Expect: []byte(v32)}); r.Status != proto.StatusCASMismatch {
		t.Fatalf("a digest condition holding the value: %+v", r)
	}
}

// TestScanPairBytesIsTheEncoding: ScanPairBytes is what a pair adds to an
// encoded SCAN answer (the room check's count must bound the answer).
func TestScanPairBytesIsTheEncoding(t *testing.T) {
	empty := len(proto.AppendResponse(nil, &proto.Response{Op: proto.OpScan}))
	for _, kv := range [][2]int{{0, 0}, {1, 0}, {5, 1_000_000}, {proto.KeyBytesMax, proto.ValueBytesMax}} {
		one := len(proto.AppendResponse(nil, &proto.Response{Op: proto.OpScan,
			Pairs: []proto.KV{{Key: make([]byte, kv[0]), Value: make([]byte, kv[1])}}}))
		if got := one - empty; got != ScanPairBytes(kv[0], kv[1]) {
			t.Fatalf("a pair of a %d-byte key and a %d-byte value adds %d bytes to a SCAN answer, ScanPairBytes says %d", kv[0], kv[1], got, ScanPairBytes(kv[0], kv[1]))
		}
	}
}

// TestScanRoomEndsThePage: a SCAN's room check is called before each pair
// is copied, in order, with the pair bytes so far (ScanPairBytes summed);
// a refusal of a later pair ends the page there with More, one of the
// first pair is the answer, with nothing copied.
func TestScanRoomEndsThePage(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	for i := 0; i < 10; i++ {
		a.apply(1, put(fmt.Sprintf("k%02d", i), strings.Repeat("v", 10*i)))
	}
	refusal := proto.Errorf(proto.StatusThrottled, "no room")
	for _, allow := range []int{0, 1, 4, 10} {
		var calls []int
		want := 0
		room := func(n int) *proto.Response {
			calls = append(calls, n)
			if len(calls) > allow {
				return refusal
			}
			return nil
		}
		resp := s.ReadResponseWithin(context.Background(), 1, &proto.Request{Op: proto.OpScan, Limit: 100}, room)
		for i := range min(allow+1, 10) {
			want += ScanPairBytes(3, 10*i)
			if calls[i] != want {
				t.Fatalf("allow %d: call %d with %d pair bytes, want %d", allow, i, calls[i], want)
			}
		}
		switch {
		case allow == 0 && resp != refusal:
			t.Fatalf("the first pair refused: %v %d pairs, want the refusal", resp.Status, len(resp.Pairs))
		case allow > 0 && (resp.Status != proto.StatusOK || len(resp.Pairs) != allow || resp.More != (allow < 10)):
			t.Fatalf("allow %d: %v %d pairs more=%v", allow, resp.Status, len(resp.Pairs), resp.More)
		}
	}
}

func TestScanLimitAndBounds(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	for i := 0; i < 20; i++ {
		a.apply(1, put(fmt.Sprintf("k%02d", i), fmt.Sprint(i)))
	}
	a.apply(2, put("k05", "other tenant"))
	pairs, more, err := s.Scan(1, []byte("k03"), []byte("k10"), 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(pairs) != 5 || !more || string(pairs[0].Key) != "k03" || string(pairs[4].Key) != "k07" {
		t.Fatalf("scan limit 5: %d pairs, more=%v, first %q", len(pairs), more, pairs[0].Key)
	}
	pairs, more, _ = s.Scan(1, []byte("k03"), []byte("k10"), 100)
	if len(pairs) != 7 || more || string(pairs[6].Key) != "k09" {
		t.Fatalf("scan to end bound: %d pairs, more=%v", len(pairs), more)
	}
	pairs, more, _ = s.Scan(1, nil, nil, 1000)
	if len(pairs) != 20 || more {
		t.Fatalf("full scan: %d pairs, more=%v", len(pairs), more)
	}
	if string(pairs[5].Value) != "5" {
		t.Fatalf("tenant 2's value leaked into tenant 1's scan: %q", pairs[5].Value)
	}
	pairs, _, _ = s.Scan(1, []byte("z"), []byte("a"), 10)
	if len(pairs) != 0 {
		t.Fatalf("inverted range returned %d pairs", len(pairs))
	}
	// Paging past a key of KeyBytesMax: its successor (the key and a zero
	// byte, proto.ScanStartBytesMax long) starts the next page.
	long := strings.Repeat("y", proto.KeyBytesMax)
	next := strings.Repeat("y", proto.KeyBytesMax-1) + "z"
	a.apply(1, put(long, "1"))
	a.apply(1, put(next, "2"))
	pairs, more, _ = s.Scan(1, []byte("y"), nil, 1)
	if len(pairs) != 1 || !more || string(pairs[0].Key) != long {
		t.Fatalf("first page: %d pairs, more %v", len(pairs), more)
	}
	pairs, _, _ = s.Scan(1, append([]byte(long), 0), nil, 1)
	if len(pairs) != 1 || string(pairs[0].Key) != next {
		t.Fatalf("the page after a key of %d bytes: %d pairs", proto.KeyBytesMax, len(pairs))
	}
}

func TestBatchAtomic(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	a.apply(1, put("c", "1"))
	ok := a.apply(1, &proto.Request{Op: proto.OpBatch, Ops: []proto.BatchOp{
		{Op: proto.OpPut, Key: []byte("a"), Value: []byte("A")},
		{Op: proto.OpCAS, Key: []byte("c"), ExpectPresent: true, Expect: []byte("1"), Value: []byte("2")},
		{Op: proto.OpDelete, Key: []byte("c0")},
	}})
	if ok.Status != proto.StatusOK {
		t.Fatalf("batch: %+v", ok)
	}
	bad := a.apply(1, &proto.Request{Op: proto.OpBatch, Ops: []proto.BatchOp{
		{Op: proto.OpPut, Key: []byte("b"), Value: []byte("B")},
		{Op: proto.OpDelete, Key: []byte("a")},
		{Op: proto.OpCAS, Key: []byte("c"), ExpectPresent: true, Expect: []byte("1"), Value: []byte("3")},
	}})
	if bad.Status != proto.StatusCASMismatch || bad.FailedOp != 2 {
		t.Fatalf("failing batch: %+v", bad)
	}
	// Nothing of the failed batch may be visible.
	if _, ok := mustGet(t, s, 1, "b"); ok {
		t.Fatal("put of a failed batch was applied")
	}
	if v, ok := mustGet(t, s, 1, "a"); !ok || v != "A" {
		t.Fatal("delete of a failed batch was applied")
	}
	if v, _ := mustGet(t, s, 1, "c"); v != "2" {
		t.Fatalf("c = %q", v)
	}
	// A conditional delete by digest (what RESP's DEL sends): the
	// condition's write is moot, the DELETE after it wins.
	stale := a.apply(1, &proto.Request{Op: proto.OpBatch, Ops: []proto.BatchOp{
		{Op: proto.OpCAS, Key: []byte("c"), ExpectPresent: true, ExpectDigest: true, Expect: proto.ValueDigest([]byte("1")), Value: []byte{}},
		{Op: proto.OpDelete, Key: []byte("c")},
	}})
	if stale.Status != proto.StatusCASMismatch || stale.FailedOp != 0 {
		t.Fatalf("delete on a stale digest: %+v", stale)
	}
	del := a.apply(1, &proto.Request{Op: proto.OpBatch, Ops: []proto.BatchOp{
		{Op: proto.OpCAS, Key: []byte("c"), ExpectPresent: true, ExpectDigest: true, Expect: proto.ValueDigest([]byte("2")), Value: []byte{}},
		{Op: proto.OpDelete, Key: []byte("c")},
	}})
	if del.Status != proto.StatusOK {
		t.Fatalf("delete on the current digest: %+v", del)
	}
	if _, ok := mustGet(t, s, 1, "c"); ok {
		t.Fatal("c survived its conditional delete")
	}
}

func TestTenantIsolation(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	a.apply(1, put("secret", "tenant-1"))
	if _, ok := mustGet(t, s, 2, "secret"); ok {
		t.Fatal("tenant 2 reads tenant 1's key")
	}
	a.apply(2, put("secret", "tenant-2"))
	a.apply(2, &proto.Request{Op: proto.OpDelete, Key: []byte("secret")})
	if v, _ := mustGet(t, s, 1, "secret"); v != "tenant-1" {
		t.Fatalf("tenant 2's writes reached tenant 1: %q", v)
	}
	// A CAS by tenant 2 compares against its own (absent) key.
	if r := a.apply(2, &proto.Request{Op: proto.OpCAS, Key: []byte("secret"), ExpectPresent: true, Expect: []byte("tenant-1"), Value: []byte("x")}); r.Status != proto.StatusCASMismatch {
		t.Fatalf("tenant 2 CAS matched tenant 1's value: %v", r.Status)
	}
	// Scans stay inside the tenant, including the highest tenant id.
	a.apply(0xFFFFFFFF, put("\xff\xff", "max"))
	a.apply(0xFFFFFFFE, put("\xff", "below max"))
	pairs, _, _ := s.Scan(0xFFFFFFFE, nil, nil, 100)
	if len(pairs) != 1 || string(pairs[0].Value) != "below max" {
		t.Fatalf("scan of tenant ffffffff-1: %+v", pairs)
	}
	pairs, _, _ = s.Scan(0xFFFFFFFF, nil, nil, 100)
	if len(pairs) != 1 || string(pairs[0].Value) != "max" {
		t.Fatalf("scan of tenant ffffffff: %+v", pairs)
	}
	// Tenant 0 is the metadata keyspace: unreachable.
	if _, _, err := s.Get(0, []byte("applied")); !errors.Is(err, ErrReservedTenant) {
		t.Fatalf("tenant 0 get: %v", err)
	}
	if _, _, err := s.Scan(0, nil, nil, 10); !errors.Is(err, ErrReservedTenant) {
		t.Fatalf("tenant 0 scan: %v", err)
	}
	res, err := s.Apply(a.slot+1, [][]byte{EncodeCommand(0, put("applied", "x"))})
	if err != nil || res[0].Status != proto.StatusBadRequest {
		t.Fatalf("tenant 0 write: %+v %v", res, err)
	}
}

func TestExactlyOnceAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	a := newApplier(t, s)
	req := &proto.Request{Op: proto.OpCAS, ClientID: 42, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("first")}
	if r := a.apply(1, req); r.Status != proto.StatusOK {
		t.Fatalf("first CAS: %v", r.Status)
	}
	// Another client changes the key; then client 42's retry arrives
	// (say, after a leader change). It must not apply again, and it must
	// be answered OK, like the original.
	a.apply(1, &proto.Request{Op: proto.OpPut, ClientID: 7, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("second")})
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir)
	defer s.Close()
	a.s = s
	if s.Applied() != a.slot {
		t.Fatalf("applied %d after restart, want %d", s.Applied(), a.slot)
	}
	retry := &proto.Request{Op: proto.OpCAS, ClientID: 42, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("first")}
	if r := a.apply(1, retry); r.Status != proto.StatusOK {
		t.Fatalf("retried CAS answered %v, want the original OK", r.Status)
	}
	if v, _ := mustGet(t, s, 1, "k"); v != "second" {
		t.Fatalf("retried CAS applied again: k=%q", v)
	}
	// The same client id under another tenant is another client.
	if r := a.apply(2, &proto.Request{Op: proto.OpPut, ClientID: 42, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("t2")}); r.Status != proto.StatusOK {
		t.Fatal(r.Status)
	}
	if v, _ := mustGet(t, s, 2, "k"); v != "t2" {
		t.Fatalf("tenant 2 write with a colliding client id was deduplicated: %q", v)
	}
	// Seq 2 acknowledges seq 1 (FirstUnacked=2): seq 1 is then forgotten
	// and a late duplicate of it is refused, not applied.
	a.apply(1, &proto.Request{Op: proto.OpPut, ClientID: 42, Seq: 2, FirstUnacked: 2, Key: []byte("j"), Value: []byte("x")})
	if r := a.apply(1, retry); r.Status != proto.StatusSequenceStale {
		t.Fatalf("duplicate below the floor answered %v, want SEQUENCE_STALE", r.Status)
	}
	if v, _ := mustGet(t, s, 1, "k"); v != "second" {
		t.Fatalf("stale duplicate applied: k=%q", v)
	}
}

func TestExactlyOnceWindow(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	// A client that never acknowledges: only the last ResultsPerClientMax
	// results are kept.
	n := ResultsPerClientMax + 10
	for i := 1; i <= n; i++ {
		a.apply(1, &proto.Request{Op: proto.OpPut, ClientID: 5, Seq: uint64(i), FirstUnacked: 1, Key: []byte("k"), Value: []byte(fmt.Sprint(i))})
	}
	e := s.entry(clientKey{1, 5})
	if len(e.results) != ResultsPerClientMax || e.floor != uint64(n-ResultsPerClientMax+1) {
		t.Fatalf("window: %d results, floor %d", len(e.results), e.floor)
	}
	if r := a.apply(1, &proto.Request{Op: proto.OpPut, ClientID: 5, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("old")}); r.Status != proto.StatusSequenceStale {
		t.Fatalf("seq below window: %v", r.Status)
	}
	if r := a.apply(1, &proto.Request{Op: proto.OpPut, ClientID: 5, Seq: uint64(n), FirstUnacked: 1, Key: []byte("k"), Value: []byte("dup")}); r.Status != proto.StatusOK {
		t.Fatalf("duplicate inside window: %v", r.Status)
	}
	if v, _ := mustGet(t, s, 1, "k"); v != fmt.Sprint(n) {
		t.Fatalf("k = %q", v)
	}
}

func TestClientEviction(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	for c := uint64(1); c <= ClientsPerTenantDefault+1; c++ {
		a.apply(1, &proto.Request{Op: proto.OpPut, ClientID: c, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("v")})
	}
	if n := len(s.clients[1].entries); n > ClientsPerTenantDefault {
		t.Fatalf("%d clients kept, share %d", n, ClientsPerTenantDefault)
	}
	// The oldest clients went first, into tombstones.
	if s.entry(clientKey{1, 1}) != nil || s.entry(clientKey{1, ClientsPerTenantDefault + 1}) == nil {
		t.Fatal("eviction did not drop the oldest entry")
	}
	if tb, ok := s.clients[1].tombs[1]; !ok || tb.next != 2 {
		t.Fatalf("evicted client 1 left tombstone %+v, %v", tb, ok)
	}
	// The table on disk matches memory.
	loaded, err := loadClients(s.db)
	if err != nil {
		t.Fatal(err)
	}
	if !tablesEqual(loaded, s.clients) {
		t.Fatal("the client table on disk differs from memory")
	}
}

func TestReplayAndBadCommand(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	cmd := EncodeCommand(1, &proto.Request{Op: proto.OpPut, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("v")})
	for slot := uint64(1); slot < 5; slot++ {
		if _, err := s.Apply(slot, nil); err != nil {
			t.Fatal(err)
		}
	}
	res, err := s.Apply(5, [][]byte{cmd, []byte("garbage"), nil})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != proto.StatusOK || res[1].Status != proto.StatusBadRequest || res[2].Status != proto.StatusBadRequest {
		t.Fatalf("results %+v", res)
	}
	// Replaying an applied slot changes nothing.
	cmd2 := EncodeCommand(1, &proto.Request{Op: proto.OpPut, ClientID: 2, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("replayed")})
	if res, err := s.Apply(5, [][]byte{cmd2}); err != nil || res != nil {
		t.Fatalf("replay: %v %v", res, err)
	}
	if v, _ := mustGet(t, s, 1, "k"); v != "v" {
		t.Fatalf("replayed slot applied: %q", v)
	}
	if s.Applied() != 5 {
		t.Fatalf("applied %d", s.Applied())
	}
}

func TestCommandRoundTrip(t *testing.T) {
	req := &proto.Request{Op: proto.OpBatch, ClientID: 3, Seq: 9, FirstUnacked: 4, Ops: []proto.BatchOp{
		{Op: proto.OpPut, Key: []byte("a"), Value: []byte("b")}}}
	tenant, got, err := DecodeCommand(EncodeCommand(77, req))
	if err != nil || tenant != 77 || got.Op != proto.OpBatch || got.Seq != 9 || got.FirstUnacked != 4 || string(got.Ops[0].Value) != "b" {
		t.Fatalf("round trip: %v %v %+v", tenant, err, got)
	}
	for _, bad := range [][]byte{nil, {2, 0, 0, 0, 1, byte(proto.OpPut)}, {1, 0, 0, 0, 1, byte(proto.OpGet)}} {
		if _, _, err := DecodeCommand(bad); err == nil {
			t.Fatalf("decoded %x", bad)
		}
	}
}

func FuzzDecodeCommand(f *testing.F) {
	f.Add(EncodeCommand(1, &proto.Request{Op: proto.OpPut, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("v")}))
	f.Add(EncodeCommand(2, &proto.Request{Op: proto.OpCAS, ClientID: 1, Seq: 3, FirstUnacked: 2, Key: []byte("k"), ExpectPresent: true, Expect: []byte("e"), Value: []byte("v")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		tenant, req, err := DecodeCommand(b)
		if err != nil {
			return
		}
		if again := EncodeCommand(tenant, req); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: %x vs %x", again, b)
		}
	})
}

func TestSnapshotRestore(t *testing.T) {
	src := openT(t, t.TempDir())
	defer src.Close()
	a := newApplier(t, src)
	for i := 0; i < 100; i++ {
		a.apply(tenants.ID(1+i%3), &proto.Request{Op: proto.OpPut, ClientID: 9, Key: []byte(fmt.Sprintf("key-%03d", i)), Value: bytes.Repeat([]byte{byte(i)}, i)})
	}
	rc, slot, err := src.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Writes after the snapshot must not be in it.
	a.apply(1, put("after", "x"))
	stream, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	dst := openT(t, dir)
	newApplier(t, dst).apply(1, put("stale", "should vanish"))
	if err := dst.Restore(bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	if dst.Applied() != slot {
		t.Fatalf("applied %d after restore, want %d", dst.Applied(), slot)
	}
	if _, ok := mustGet(t, dst, 1, "stale"); ok {
		t.Fatal("restore kept a key not in the snapshot")
	}
	if _, ok := mustGet(t, dst, 1, "after"); ok {
		t.Fatal("snapshot holds a write made after it")
	}
	for i := 0; i < 100; i++ {
		v, ok := mustGet(t, dst, tenants.ID(1+i%3), fmt.Sprintf("key-%03d", i))
		if !ok || v != string(bytes.Repeat([]byte{byte(i)}, i)) {
			t.Fatalf("key %d lost or wrong after restore", i)
		}
	}
	// The exactly-once table travelled with the snapshot.
	b := newApplier(t, dst)
	if r := b.apply(1, &proto.Request{Op: proto.OpPut, ClientID: 9, Seq: 100, FirstUnacked: 100, Key: []byte("key-099"), Value: []byte("dup")}); r.Status != proto.StatusOK {
		t.Fatal(r.Status)
	}
	if v, _ := mustGet(t, dst, 1, "key-099"); v == "dup" {
		t.Fatal("duplicate of a snapshotted write applied again")
	}
	// It survives a restart.
	dst.Close()
	dst = openT(t, dir)
	defer dst.Close()
	if v, ok := mustGet(t, dst, 2, "key-001"); !ok || v != "\x01" {
		t.Fatalf("after reopen: %q %v", v, ok)
	}
}

// TestRestoreRejectsBadStreams: a bad stream is refused before anything
// is replaced: the state is as it was, the SM goes on applying, and it
// reopens (no "restore did not finish" dead end).
func TestRestoreRejectsBadStreams(t *testing.T) {
	src := openT(t, t.TempDir())
	defer src.Close()
	newApplier(t, src).apply(1, put("k", "v"))
	rc, _, _ := src.Snapshot()
	good, _ := io.ReadAll(rc)
	rc.Close()
	flip := bytes.Clone(good)
	flip[len(flip)/2] ^= 0x40
	cases := map[string][]byte{
		"empty":     nil,
		"bad magic": append([]byte("NOTASNAP"), good[8:]...),
		"truncated": good[:len(good)-5],
		"bit flip":  flip,
		"trailing":  append(bytes.Clone(good), 0),
	}
	dir := t.TempDir()
	dst := openT(t, dir)
	a := newApplier(t, dst)
	a.apply(2, put("mine", "kept"))
	for name, stream := range cases {
		if err := dst.Restore(bytes.NewReader(stream)); !errors.Is(err, ErrBadSnapshot) {
			t.Fatalf("%s: restore error %v, want ErrBadSnapshot", name, err)
		}
		if v, ok := mustGet(t, dst, 2, "mine"); !ok || v != "kept" {
			t.Fatalf("%s: a refused snapshot changed the state (%q, %v)", name, v, ok)
		}
	}
	a.apply(2, put("after", "1"))
	dst.Close()
	dst = openT(t, dir)
	defer dst.Close()
	if v, ok := mustGet(t, dst, 2, "after"); !ok || v != "1" || dst.Applied() != 2 {
		t.Fatalf("after reopen: %q %v applied %d", v, ok, dst.Applied())
	}
	if _, err := os.Stat(dir + restoreDirSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused restore left its directory: %v", err)
	}
}

// TestRestoreInterruptedAtEveryStep leaves the directories as a crash
// would at each point of a Restore and checks that Open recovers: before
// the new state is complete the old one stays; once it is complete (done
// file durable) the new one is swapped in; no point leaves a directory
// that refuses to open or a mix of both states.
func TestRestoreInterruptedAtEveryStep(t *testing.T) {
	src := openT(t, t.TempDir())
	defer src.Close()
	sa := newApplier(t, src)
	for i := 0; i < 50; i++ {
		sa.apply(1, put(fmt.Sprintf("new-%02d", i), "n"))
	}
	rc, newSlot, _ := src.Snapshot()
	stream, _ := io.ReadAll(rc)
	rc.Close()

	type state int
	const (
		wantOld state = iota
		wantNew
	)
	steps := []struct {
		name string
		// crash arranges the directories of a restore of stream into an
		// SM at dir whose live state is the old one, as a crash would.
		crash func(t *testing.T, dir string)
		want  state
	}{
		{"mid-stream (no done file)", func(t *testing.T, dir string) {
			crashDuringRestore(t, dir, stream[:len(stream)/2])
		}, wantOld},
		{"complete, before the swap", func(t *testing.T, dir string) {
			crashDuringRestore(t, dir, stream)
		}, wantNew},
		{"old renamed away, new not yet in", func(t *testing.T, dir string) {
			crashDuringRestore(t, dir, stream)
			mustRename(t, dir, dir+oldDirSuffix)
		}, wantNew},
		{"new renamed in, done file and old left", func(t *testing.T, dir string) {
			crashDuringRestore(t, dir, stream)
			mustRename(t, dir, dir+oldDirSuffix)
			mustRename(t, dir+restoreDirSuffix, dir)
		}, wantNew},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "sm")
			s := openT(t, dir)
			a := newApplier(t, s)
			for i := 0; i < 10; i++ {
				a.apply(2, put(fmt.Sprintf("old-%02d", i), "o"))
			}
			s.Close()
			st.crash(t, dir)
			s, err := Open(dir, Options{})
			if err != nil {
				t.Fatalf("open after the crash: %v", err)
			}
			defer s.Close()
			_, hasOld := mustGet(t, s, 2, "old-00")
			_, hasNew := mustGet(t, s, 1, "new-00")
			switch {
			case st.want == wantOld && (!hasOld || hasNew || s.Applied() != 10):
				t.Fatalf("want the old state: old %v new %v applied %d", hasOld, hasNew, s.Applied())
			case st.want == wantNew && (hasOld || !hasNew || s.Applied() != newSlot):
				t.Fatalf("want the new state: old %v new %v applied %d (want %d)", hasOld, hasNew, s.Applied(), newSlot)
			}
			for _, leftover := range []string{dir + restoreDirSuffix, dir + oldDirSuffix, filepath.Join(dir, restoreDoneFile)} {
				if _, err := os.Stat(leftover); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("%s left after recovery", leftover)
				}
			}
		})
	}
}

// crashDuringRestore runs a Restore of stream into the SM at dir and stops
// it as a crash would: just before the swap when the stream is whole, or
// at the stream's error otherwise (the restore directory then has no done
// file).
func crashDuringRestore(t *testing.T, dir string, stream []byte) {
	t.Helper()
	s := openT(t, dir)
	defer s.Close()
	type crashed struct{}
	TestingCrashBeforeSwap = func() { panic(crashed{}) }
	defer func() { TestingCrashBeforeSwap = nil }()
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(crashed); !ok {
					panic(r)
				}
				return // Restore's deferred unlock ran while the panic unwound
			}
		}()
		err := s.Restore(bytes.NewReader(stream))
		if err == nil {
			t.Fatal("the restore finished: the crash hook did not run")
		}
		// A cut stream: a real crash mid-stream leaves the partial
		// directory, which the refused Restore removed: put one back.
		if err := os.MkdirAll(dir+restoreDirSuffix, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir+restoreDirSuffix, "000001.sst"), stream[:len(stream)/2], 0o640); err != nil {
			t.Fatal(err)
		}
	}()
}

func mustRename(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}

func TestCloseAbortsSnapshotStream(t *testing.T) {
	s := openT(t, t.TempDir())
	newApplier(t, s).apply(1, put("k", string(make([]byte, 1<<20))))
	rc, _, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(rc); err == nil {
		t.Fatal("snapshot stream completed after Close")
	}
}

func TestReadsAfterClose(t *testing.T) {
	s := openT(t, t.TempDir())
	newApplier(t, s).apply(1, put("k", "v"))
	s.Close()
	if _, _, err := s.Get(1, []byte("k")); !errors.Is(err, ErrClosed) {
		t.Fatalf("get after close: %v", err)
	}
	if _, _, err := s.Scan(1, nil, nil, 10); !errors.Is(err, ErrClosed) {
		t.Fatalf("scan after close: %v", err)
	}
	if _, err := s.Apply(99, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("apply after close: %v", err)
	}
}

// TestConcurrentReadsDuringApply runs readers against a stream of applies;
// with -race it checks the SM's locking, and it checks that a reader never
// sees a value from the future (values only grow).
func TestConcurrentReadsDuringApply(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	done := make(chan struct{})
	errs := make(chan error, 4)
	for r := 0; r < 2; r++ {
		go func() {
			last := -1
			for {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				v, ok, err := s.Get(1, []byte("counter"))
				if err != nil {
					errs <- err
					return
				}
				if ok {
					var n int
					fmt.Sscan(string(v), &n)
					if n < last {
						errs <- fmt.Errorf("counter went back from %d to %d", last, n)
						return
					}
					last = n
				}
				if _, _, err := s.Scan(1, nil, nil, 10); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := 0; i < 300; i++ {
		a.apply(1, put("counter", fmt.Sprint(i)))
	}
	close(done)
	for r := 0; r < 2; r++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestPebbleErrorLinesLimited: Pebble's error lines pass at most one per
// pebbleErrorLogEvery, and the next one that passes counts those left out.
func TestPebbleErrorLinesLimited(t *testing.T) {
	l := newPebbleLimiter()
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at   time.Duration
		ok   bool
		left uint64
	}{
		{0, true, 0},
		{time.Millisecond, false, 0},
		{pebbleErrorLogEvery - time.Nanosecond, false, 0},
		{pebbleErrorLogEvery, true, 2},
		{pebbleErrorLogEvery + 1, false, 0},
		{3 * pebbleErrorLogEvery, true, 1},
	}
	for i, s := range steps {
		ok, left := l.Allow(t0.Add(s.at))
		if ok != s.ok || left != s.left {
			t.Fatalf("step %d at %v: allow %v, %d left out; want %v, %d", i, s.at, ok, left, s.ok, s.left)
		}
	}
}

// TestCommandBytesHoldsTheCommand: CommandBytes is room for the whole
// command of every write kind at its size limits, so a command encoded
// into it (kv/replica WriteRequest) is never copied to grow.
func TestCommandBytesHoldsTheCommand(t *testing.T) {
	big := func(n int) []byte { return bytes.Repeat([]byte("x"), n) }
	ops := make([]proto.BatchOp, proto.BatchOpsMax)
	for i := range ops {
		switch i % 4 {
		case 0:
			ops[i] = proto.BatchOp{Op: proto.OpPut, Key: big(1 + i), Value: big(i * 7)}
		case 1:
			ops[i] = proto.BatchOp{Op: proto.OpDelete, Key: big(proto.KeyBytesMax)}
		case 2:
			ops[i] = proto.BatchOp{Op: proto.OpCAS, Key: big(3), Value: big(5), ExpectPresent: true, Expect: big(11)}
		default:
			ops[i] = proto.BatchOp{Op: proto.OpCAS, Key: big(1), ExpectPresent: true, ExpectDigest: true, Expect: big(proto.ExpectDigestBytes)}
		}
	}
	w := proto.Request{ClientID: ^uint64(0), Seq: proto.SeqMax, FirstUnacked: proto.SeqMax}
	for _, req := range []proto.Request{
		{Op: proto.OpPut, Key: big(proto.KeyBytesMax), Value: big(1 << 20)},
		{Op: proto.OpPut, Key: big(1)},
		{Op: proto.OpDelete, Key: big(proto.KeyBytesMax)},
		{Op: proto.OpCAS, Key: big(9), Value: big(100), ExpectPresent: true, Expect: big(4096)},
		{Op: proto.OpCAS, Key: big(9), Value: big(100), ExpectPresent: true, ExpectDigest: true, Expect: big(proto.ExpectDigestBytes)},
		{Op: proto.OpCAS, Key: big(9), Value: big(100)},
		{Op: proto.OpBatch, Ops: ops},
		{Op: proto.OpBatch, Ops: ops[:1]},
	} {
		req.ClientID, req.Seq, req.FirstUnacked = w.ClientID, w.Seq, w.FirstUnacked
		if n, room := len(EncodeCommand(^tenants.ID(0), &req)), CommandBytes(&req); n > room {
			t.Errorf("%v with %d ops: command of %d bytes, CommandBytes %d", req.Op, len(req.Ops), n, room)
		}
	}
}
