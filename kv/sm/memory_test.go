package sm

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"synod/kv/proto"
	"synod/tenants"
)

func TestPebbleMemoryFor(t *testing.T) {
	if _, err := PebbleMemoryFor(PebbleBytesMin - 1); err == nil {
		t.Fatal("a share below PebbleBytesMin was accepted")
	}
	prev := PebbleMemory{}
	for share := PebbleBytesMin; share <= 8<<30; share = share*5/4 + 1 {
		m, err := PebbleMemoryFor(share)
		if err != nil {
			t.Fatalf("share %d: %v", share, err)
		}
		worst := pebbleMemtableWorstBytes(int64(m.MemTableBytes), m.MemTables)
		switch {
		case m.Bound() != share || m.CacheBytes != share:
			t.Fatalf("share %d: cache %d, bound %d; want both the share", share, m.CacheBytes, m.Bound())
		case worst*pebbleBlockShareDivisor > m.CacheBytes:
			t.Fatalf("share %d: memtables may reserve %d, more than 1/%d of the cache", share, worst, pebbleBlockShareDivisor)
		case m.MemTableBytes < MemTableBytesMin || m.MemTableBytes > MemTableBytesMax || m.MemTables != MemTablesDefault:
			t.Fatalf("share %d: memtables %d x %d outside the bounds", share, m.MemTables, m.MemTableBytes)
		case m.MemTableBytes < prev.MemTableBytes:
			t.Fatalf("share %d: memtable %d smaller than for a smaller share (%d)", share, m.MemTableBytes, prev.MemTableBytes)
		case m.MemTableBytes < MemTableBytesMax &&
			pebbleMemtableWorstBytes(int64(2*m.MemTableBytes), m.MemTables)*pebbleBlockShareDivisor <= share:
			t.Fatalf("share %d: memtable %d, but twice that would fit", share, m.MemTableBytes)
		}
		prev = m
	}
}

// TestPebbleMemoryWithinCache checks memory.go's contract on a real
// Pebble: with the derived options, the block cache plus the memtables
// (both manual memory) never exceed CacheBytes while data several times
// the cache is written and read back, and across a restore, whose staging
// Pebble shares the cache (the SM's own reference keeps it alive through
// the swap, when no Pebble holds it).
func TestPebbleMemoryWithinCache(t *testing.T) {
	m, err := PebbleMemoryFor(PebbleBytesMin)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{CacheBytes: m.CacheBytes, MemTableBytes: m.MemTableBytes, MemTables: m.MemTables}
	s, err := Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const (
		valueBytes = 4 << 10
		keys       = 16 * 1024 // 64 MiB of values: twice the cache
	)
	peak := int64(0)
	check := func(what string) {
		t.Helper()
		s.dbMu.RLock()
		pm := s.db.Metrics()
		s.dbMu.RUnlock()
		used := pm.BlockCache.Size + int64(pm.MemTable.Size) + int64(pm.MemTable.ZombieSize)
		peak = max(peak, used)
		// The cache's shards round a reservation up: allow one block per
		// shard of slack.
		if slack := int64(4 << 10 * 64); used > m.Bound()+slack {
			t.Fatalf("%s: blocks %d + memtables %d + zombies %d = %d > bound %d",
				what, pm.BlockCache.Size, pm.MemTable.Size, pm.MemTable.ZombieSize, used, m.Bound())
		}
	}
	a := newApplier(t, s)
	val := bytes.Repeat([]byte("v"), valueBytes)
	for i := 0; i < keys; i++ {
		a.apply(1, &proto.Request{Op: proto.OpPut, Key: []byte(fmt.Sprintf("k%08d", i)), Value: val})
		if i%512 == 0 {
			check(fmt.Sprintf("write %d", i))
		}
	}
	for i := 0; i < keys; i += 3 {
		if _, ok := mustGet(t, s, 1, fmt.Sprintf("k%08d", i)); !ok {
			t.Fatalf("key %d lost", i)
		}
		if i%1536 == 0 {
			check(fmt.Sprintf("read %d", i))
		}
	}
	// A restore into the same SM: staged beside the live Pebble with the
	// shared cache, then swapped in.
	rc, slot, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	stream, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	a.apply(1, put("after", "x"))
	if err := s.Restore(bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	if s.Applied() != slot {
		t.Fatalf("applied %d after the restore, want %d", s.Applied(), slot)
	}
	for i := 0; i < keys; i += 7 {
		if _, ok := mustGet(t, s, tenants.ID(1), fmt.Sprintf("k%08d", i)); !ok {
			t.Fatalf("key %d lost by the restore", i)
		}
	}
	check("after the restore")
	t.Logf("cache %d MiB, memtables %d x %d MiB; peak blocks+memtables %.1f MiB",
		m.CacheBytes>>20, m.MemTables, m.MemTableBytes>>20, float64(peak)/(1<<20))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s.mem.cache != nil {
		t.Fatal("the SM kept its cache reference after Close")
	}
}
