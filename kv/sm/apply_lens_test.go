package sm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"synod/kv/proto"
	"synod/tenants"
)

// checkApplyLensExact fails unless every remembered length is the one the
// store holds (-1: absent) and the table's byte count is its entries'.
func checkApplyLensExact(t *testing.T, s *SM, when string) {
	t.Helper()
	bytes := 0
	for k, n := range s.alens.lens {
		bytes += len(k) + applyLenEntryBytes
		got, ok, err := storedValueLen(s.db, []byte(k))
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			got = -1
		}
		if got != n {
			t.Fatalf("%s: remembered length %d for %q, the store holds %d", when, n, k, got)
		}
	}
	if bytes != s.alens.bytes || bytes > applyLensBytesMax {
		t.Fatalf("%s: table counts %d bytes, its entries cost %d (bound %d)", when, s.alens.bytes, bytes, applyLensBytesMax)
	}
}

// TestApplyLensStayExact: a seeded mix of every write, with the table
// checked every seventh slot (every slot costs minutes under -race): every
// remembered length is the stored one and the usage figures are exact;
// a restore forgets the table, and writes after it stay exact.
func TestApplyLensStayExact(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	rng := rand.New(rand.NewPCG(3, 4))
	key := func() []byte { return []byte(fmt.Sprintf("key-%03d", rng.IntN(300))) }
	value := func() []byte { return bytes.Repeat([]byte{'v'}, rng.IntN(300)) }
	for i := 0; i < 1500; i++ {
		tenant := tenants.ID(1 + rng.IntN(2))
		req := randomWrite(t, s, tenant, rng, key, value)
		a.apply(tenant, req)
		if i%50 == 0 {
			if _, err := s.Flush(); err != nil { // the Gets that miss then read tables
				t.Fatal(err)
			}
		}
		if i%7 == 0 || i == 1499 {
			checkApplyLensExact(t, s, fmt.Sprintf("slot %d", a.slot))
			checkUsageExact(t, s, fmt.Sprintf("slot %d", a.slot))
		}
	}
	if len(s.alens.lens) < 100 {
		t.Fatalf("the table remembers %d keys after 1,500 writes to 600", len(s.alens.lens))
	}
	restoreOverStaleKey(t, s)
}

// restoreOverStaleKey restores src's snapshot into a store that overwrote
// a key src does not hold, then deletes and rewrites that key: exact only
// if the restore forgot the remembered length.
func restoreOverStaleKey(t *testing.T, src *SM) {
	t.Helper()
	dst := restoredOverStaleKey(t, src)
	defer dst.Close()
	d := newApplier(t, dst)
	d.apply(1, &proto.Request{ClientID: 77, Op: proto.OpDelete, Key: []byte("stale")})
	checkUsageExact(t, dst, "a delete of a key the restore removed")
	d.apply(1, &proto.Request{ClientID: 77, Op: proto.OpPut, Key: []byte("stale"), Value: []byte("back")})
	checkUsageExact(t, dst, "a put of a key the restore removed")
	checkApplyLensExact(t, dst, "after the restore")
}

// restoredOverStaleKey returns a new store that wrote and overwrote the
// key "stale" (so remembers its length), then restored src's snapshot.
func restoredOverStaleKey(t *testing.T, src *SM) *SM {
	t.Helper()
	stream, _ := snapshotBytes(t, src)
	dst := openT(t, t.TempDir())
	d := newApplier(t, dst)
	d.apply(1, put("stale", "written"))
	d.apply(1, put("stale", "overwritten: remembered, gone after the restore"))
	if _, ok := dst.alens.lookup(dataKey(1, []byte("stale"))); !ok {
		t.Fatal("an overwritten key is not remembered")
	}
	if err := dst.Restore(bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestApplyLensKeptOnSwapCaught: the checks above catch a table that
// survives a restore.
func TestApplyLensKeptOnSwapCaught(t *testing.T) {
	src := openT(t, t.TempDir())
	defer src.Close()
	newApplier(t, src).apply(1, put("k", "v"))
	testingApplyLensKeptOnSwap = true
	dst := restoredOverStaleKey(t, src)
	testingApplyLensKeptOnSwap = false
	defer dst.Close()
	newApplier(t, dst).apply(1, &proto.Request{ClientID: 77, Op: proto.OpDelete, Key: []byte("stale")})
	if !plantedUsageCaught(t, dst, "apply lens planted kept-on-restore") {
		t.Fatal("a remembered length kept across a restore went unnoticed")
	}
}

// TestApplyLensKeepsOldCaught: the checks catch a table that keeps a
// remembered key's old length after an overwrite.
func TestApplyLensKeepsOldCaught(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	a.apply(1, put("k", "1"))
	a.apply(1, put("k", "22")) // remembered from here
	testingApplyLensKeepsOld = true
	a.apply(1, put("k", "333"))
	testingApplyLensKeepsOld = false
	a.apply(1, put("k", "4444"))
	if !plantedUsageCaught(t, s, "apply lens planted keeps-old-length") {
		t.Fatal("a remembered length left stale by an overwrite went unnoticed")
	}
}

// TestApplyLensBound: keys written for the first time are not
// remembered; overwritten keys whose entries cost more than the bound in
// all leave the table at or under it, still exact; a key longer than the
// bound could hold is not remembered.
func TestApplyLensBound(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	long := bytes.Repeat([]byte{'k'}, proto.KeyBytesMax-8)
	n := 2 * applyLensBytesMax / (len(long) + applyLenEntryBytes)
	pass := func(value string) {
		for i := 0; i < n; i += 64 {
			req := &proto.Request{Op: proto.OpBatch}
			for j := i; j < min(i+64, n); j++ {
				req.Ops = append(req.Ops, proto.BatchOp{Op: proto.OpPut, Key: fmt.Appendf(bytes.Clone(long), "%08d", j), Value: []byte(value)})
			}
			a.apply(1, req)
		}
	}
	pass("v")
	if len(s.alens.lens) != 0 {
		t.Fatalf("%d keys written once are remembered", len(s.alens.lens))
	}
	pass("vv")
	if s.alens.bytes > applyLensBytesMax || s.alens.bytes < applyLensBytesMax-(len(long)+8+applyLenEntryBytes) {
		t.Fatalf("table of %d bytes after overwriting %d keys of %d bytes; bound %d", s.alens.bytes, n, len(long)+8, applyLensBytesMax)
	}
	checkApplyLensExact(t, s, "at the bound")
	// Overwrite every key again: remembered or forgotten, the figures stay exact.
	pass("vvv")
	checkApplyLensExact(t, s, "after overwriting")
	checkUsageExact(t, s, "after overwriting")

	var tiny applyLens
	huge := string(make([]byte, applyLensBytesMax))
	tiny.applied(map[string]int{huge: 1}, []string{huge})
	if len(tiny.lens) != 0 || tiny.bytes != 0 {
		t.Fatalf("an entry above the bound was remembered: %d entries, %d bytes", len(tiny.lens), tiny.bytes)
	}
}

// BenchmarkApplyOverwrites: one slot of 32 overwrites of 128-byte values
// spread over 100,000 keys written twice and flushed into tables, with
// the table of remembered lengths (about 70,000 of them fit) and without
// it (the Get per write it saves).
func BenchmarkApplyOverwrites(b *testing.B) {
	for _, off := range []bool{false, true} {
		b.Run(fmt.Sprintf("lens_off=%v", off), func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			testingApplyLensOff = off
			defer func() { testingApplyLensOff = false }()
			const keys = 100_000
			value := bytes.Repeat([]byte{'v'}, 128)
			slot := s.Applied()
			seq := uint64(0)
			applySlot := func(first int, stride int) {
				cmds := make([][]byte, 0, 32)
				for j := 0; j < 32; j++ {
					seq++
					req := &proto.Request{Op: proto.OpPut, ClientID: 1, Seq: seq, FirstUnacked: seq,
						Key: fmt.Appendf(nil, "key-%06d", (first+j*stride)%keys), Value: value}
					cmds = append(cmds, EncodeCommand(1, req))
				}
				slot++
				if _, err := s.Apply(slot, cmds); err != nil {
					b.Fatal(err)
				}
			}
			for pass := 0; pass < 2; pass++ { // written, then overwritten (remembered)
				for i := 0; i < keys; i += 32 {
					applySlot(i, 1)
				}
			}
			if _, err := s.Flush(); err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(5, 6))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				applySlot(rng.IntN(keys), 7919) // zipf-free: spread over the keys
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*32), "ns/write")
		})
	}
}
