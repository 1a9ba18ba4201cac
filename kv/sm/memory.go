package sm

import (
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// Pebble's memory. This file is the one place that sets Pebble's memory
// options (block cache, memtable size and count); other Pebble tuning goes
// in pebbleOptions (sm.go) and must leave these to setPebbleMemory.
//
// Pebble's large consumers live outside the Go heap (manual memory: C
// malloc in a cgo build) and are bounded together by one figure,
// Options.CacheBytes:
//
//   - one block cache of CacheBytes, shared by every Pebble the SM opens
//     (the live one and a snapshot's staging one, pebbleInstancesMax in
//     all), so installing a snapshot does not add a second cache;
//   - memtables: Pebble reserves every memtable it allocates (and every
//     large batch it queues as a flushable one) from that same cache,
//     which shrinks by as much; so blocks plus memtables stay within
//     CacheBytes as long as the memtables alone fit in it. Each Pebble
//     holds at most MemTables+1 memtables of MemTableBytes (Pebble's
//     MemTableStopWritesThreshold is MemTables: it stops writes once that
//     many are queued, and one more may be started before the check), and
//     restoreBatchBytesMax is reserved besides for the staging side (it
//     ingests tables, snapshot_ingest.go: its memtable stays empty);
//     PebbleMemoryFor sizes them to half the cache at most, leaving the
//     other half for blocks.
//
// So Pebble's manual memory is at most CacheBytes (PebbleMemory.Bound),
// plus blocks an open iterator pins past their eviction (a few blocks per
// iterator). Pebble's Go-heap state (open table readers, the manifest,
// compaction and iterator state) is small and counted with the Go heap.
const (
	// pebbleInstancesMax is how many Pebbles an SM has open at once: the
	// live one and at most one staging (snapshot_stage.go).
	pebbleInstancesMax = 2
	// MemTableBytesMin and MemTableBytesMax bound a derived memtable.
	// Below 2 MiB flushes get frequent (Pebble's default is 4 MiB); above
	// 64 MiB a flush holds the memory long for no gain at this store's
	// write rates.
	MemTableBytesMin = 2 << 20
	MemTableBytesMax = 64 << 20
	// MemTablesDefault is Pebble's MemTableStopWritesThreshold: writes
	// wait for a flush once this many memtables are queued.
	MemTablesDefault = 2
	// pebbleBlockShareDivisor: the memtables' worst case takes at most
	// 1/pebbleBlockShareDivisor of the cache; the rest is left for blocks.
	pebbleBlockShareDivisor = 2
)

// PebbleMemory is the state machine's Pebble memory: Options.CacheBytes,
// MemTableBytes and MemTables.
type PebbleMemory struct {
	CacheBytes    int64
	MemTableBytes uint64
	MemTables     int
}

// PebbleBytesMin is the least Pebble share PebbleMemoryFor accepts: room
// for the smallest memtables of both Pebbles in half the cache.
var PebbleBytesMin = pebbleMemtableWorstBytes(MemTableBytesMin, MemTablesDefault) * pebbleBlockShareDivisor

// pebbleMemtableWorstBytes is what the memtables of every open Pebble
// may reserve at once, plus the staging reserve (restoreBatchBytesMax).
// (Apply batches, one slot each, stay below half a memtable and go into
// the memtables.)
func pebbleMemtableWorstBytes(memTableBytes int64, memTables int) int64 {
	return pebbleInstancesMax*int64(memTables+1)*memTableBytes + restoreBatchBytesMax
}

// PebbleMemoryFor derives Pebble's memory from the bytes the node's
// budget gives it: the whole share is the cache, and memtables are the
// largest (a power of two in [MemTableBytesMin, MemTableBytesMax]) whose
// worst case fits in half of it. A share below PebbleBytesMin is an error.
func PebbleMemoryFor(shareBytes int64) (PebbleMemory, error) {
	if shareBytes < PebbleBytesMin {
		return PebbleMemory{}, fmt.Errorf("sm: a Pebble share of %d bytes is below the minimum %d", shareBytes, PebbleBytesMin)
	}
	m := PebbleMemory{CacheBytes: shareBytes, MemTableBytes: MemTableBytesMin, MemTables: MemTablesDefault}
	for m.MemTableBytes < MemTableBytesMax &&
		pebbleMemtableWorstBytes(int64(2*m.MemTableBytes), m.MemTables)*pebbleBlockShareDivisor <= shareBytes {
		m.MemTableBytes *= 2
	}
	return m, nil
}

// Bound is the most manual memory Pebble holds with m (iterator-pinned
// blocks aside): the cache, which the memtables are reserved from.
func (m PebbleMemory) Bound() int64 { return m.CacheBytes }

// pebbleMem is the SM's Pebble memory state: the cache every Pebble it
// opens shares. The SM holds its own reference from first use to Close,
// so the cache survives the moment of a swap when no Pebble holds it.
type pebbleMem struct {
	mu       sync.Mutex
	cache    *pebble.Cache // nil: each Pebble makes its default cache
	released bool
}

// setPebbleMemory sets po's memory options from s.opts: the shared cache
// and the memtables. Zero options keep Pebble's defaults (its own 8 MiB
// cache per Pebble, 4 MiB memtables, a threshold of 2).
func (s *SM) setPebbleMemory(po *pebble.Options) {
	m := &s.mem
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cache == nil && !m.released && s.opts.CacheBytes > 0 {
		m.cache = pebble.NewCache(s.opts.CacheBytes)
	}
	if m.cache != nil {
		po.Cache = m.cache // each Pebble takes a reference of its own
	}
	if s.opts.MemTableBytes > 0 {
		po.MemTableSize = s.opts.MemTableBytes
	}
	if s.opts.MemTables > 0 {
		po.MemTableStopWritesThreshold = s.opts.MemTables
	}
}

// release drops the SM's reference to the shared cache (Close, Abandon, a
// failed Open); its memory goes once no Pebble holds it either.
func (m *pebbleMem) release() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.released = true
	if m.cache != nil {
		m.cache.Unref()
		m.cache = nil
	}
}

// PebbleUse is what the live Pebble holds in memory now, from its own
// metrics: the figures behind the bound above.
type PebbleUse struct {
	// CacheBytes is the block cache's size (shared by every Pebble).
	CacheBytes int64
	// MemTableBytes is memtables and flushable batches allocated.
	MemTableBytes uint64
	// ZombieMemTableBytes is flushed memtables that an open iterator (a
	// snapshot stream's, a scan's) still holds: manual memory outside
	// the cache's reservation until the iterator closes.
	ZombieMemTableBytes uint64
	ZombieMemTables     int64
	// TableIters is the sstable iterators open.
	TableIters int64
}

// PebbleUse reports the live Pebble's memory (false once closed).
func (s *SM) PebbleUse() (PebbleUse, bool) {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.dbClosed {
		return PebbleUse{}, false
	}
	m := s.db.Metrics()
	return PebbleUse{
		CacheBytes:          m.BlockCache.Size,
		MemTableBytes:       m.MemTable.Size,
		ZombieMemTableBytes: m.MemTable.ZombieSize,
		ZombieMemTables:     m.MemTable.ZombieCount,
		TableIters:          m.TableIters,
	}, true
}
