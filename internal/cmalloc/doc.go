// Package cmalloc tunes the C allocator that holds Pebble's manual memory
// (block cache and memtables: C malloc in a cgo build).
//
// glibc's defaults let that memory grow past what Pebble has allocated:
// up to 8 arenas per core, each keeping what was freed in it, and a
// dynamic mmap threshold that rises to the size of the largest block
// freed, so after the first memtable is freed every later one comes from
// an arena and stays resident after Pebble frees it. Measured on the
// 2-core CI machine (e2e TestMemoryBoundedByBudget with
// E2E_MEM_PAUSE_FOLLOWER=1 and E2E_MEM_DIAG_DIR): a leader serving
// snapshots had 30-40 MiB of anonymous memory beyond the Go runtime's and
// Pebble's own figures; RSS 154-184 MiB of a 192 MiB budget, 141-143 MiB
// with both settings below.
//
// Linking the package tunes the allocator: a C constructor, run when the
// process is loaded and before the Go runtime starts a thread, bounds the
// arenas (ArenasMax) and fixes the mmap threshold (MmapThresholdBytes),
// which turns glibc's dynamic threshold off: a block of at least that
// size is mapped on its own and unmapped when freed. The same mallopt
// calls made from Go at start measured little better than nothing: glibc
// fixes its arena limit the first time threads contend. The constructor
// leaves the allocator alone when GLIBC_TUNABLES sets any glibc.malloc
// tunable (the operator's choice); the package does nothing in a build
// without cgo or glibc. Tune reports the outcome for the log.
package cmalloc

const (
	// ArenasMax bounds glibc's malloc arenas. Pebble allocates on block
	// cache misses and memtable rotations, not per request; per-thread
	// caches (tcache) take the small allocations before an arena's lock.
	ArenasMax = 2
	// MmapThresholdBytes is the fixed mmap threshold: glibc's initial
	// default. Memtables (>= 2 MiB) and large flushable batches are
	// above it; data blocks (a few KiB to a few tens of KiB) below it.
	MmapThresholdBytes = 128 << 10
)
