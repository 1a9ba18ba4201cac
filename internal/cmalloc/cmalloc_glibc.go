//go:build linux && cgo

package cmalloc

/*
#include <malloc.h>
#include <stdlib.h>

#if defined(__GLIBC__)
#include <string.h>

// CMALLOC_ARENAS_MAX and CMALLOC_MMAP_THRESHOLD_BYTES are ArenasMax and
// MmapThresholdBytes (TestConstantsMatchC).
#define CMALLOC_ARENAS_MAX 2
#define CMALLOC_MMAP_THRESHOLD_BYTES (128 << 10)

// cmalloc_result: 0 not run, 1 tuned, 2 left alone (GLIBC_TUNABLES sets
// malloc tunables), -1/-2 mallopt refused the arenas/threshold.
static int cmalloc_result;

// cmalloc_init runs when the process is loaded, before the Go runtime
// starts a thread: glibc fixes its arena limit the first time threads
// contend, so a mallopt from Go code comes too late for it (measured).
__attribute__((constructor)) static void cmalloc_init(void) {
	const char *t = getenv("GLIBC_TUNABLES");
	if (t != NULL && strstr(t, "glibc.malloc.") != NULL) {
		cmalloc_result = 2;
		return;
	}
	if (mallopt(M_ARENA_MAX, CMALLOC_ARENAS_MAX) != 1) { cmalloc_result = -1; return; }
	if (mallopt(M_MMAP_THRESHOLD, CMALLOC_MMAP_THRESHOLD_BYTES) != 1) { cmalloc_result = -2; return; }
	cmalloc_result = 1;
}
static int cmalloc_status(void) { return cmalloc_result; }
static long cmalloc_mapped(void) { return (long)mallinfo2().hblkhd; }
static int cmalloc_arenas_max(void) { return CMALLOC_ARENAS_MAX; }
static int cmalloc_threshold(void) { return CMALLOC_MMAP_THRESHOLD_BYTES; }
#else
static int cmalloc_status(void) { return 0; }
static long cmalloc_mapped(void) { return -1; }
static int cmalloc_arenas_max(void) { return 0; }
static int cmalloc_threshold(void) { return 0; }
#endif
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Tune reports what the package did to the allocator when the process
// was loaded (a C constructor applies ArenasMax and MmapThresholdBytes
// before the Go runtime starts): whether it changed it; an error says
// which setting glibc refused. Linking the package is what tunes; Tune
// is for the log.
func Tune() (bool, error) {
	switch C.cmalloc_status() {
	case 1:
		return true, nil
	case -1:
		return false, fmt.Errorf("cmalloc: mallopt(M_ARENA_MAX, %d) refused", ArenasMax)
	case -2:
		return false, fmt.Errorf("cmalloc: mallopt(M_MMAP_THRESHOLD, %d) refused", MmapThresholdBytes)
	default:
		return false, nil // not glibc, or GLIBC_TUNABLES sets malloc tunables
	}
}

// cConstants are the C side's copies of ArenasMax and MmapThresholdBytes.
func cConstants() (arenas, threshold int) {
	return int(C.cmalloc_arenas_max()), int(C.cmalloc_threshold())
}

// errNoGlibc: MappedBytes has nothing to report.
var errNoGlibc = errors.New("cmalloc: not glibc")

// MappedBytes is the C allocator's memory in blocks mapped on their own
// (mallinfo2 hblkhd), for tests.
func MappedBytes() (int64, error) {
	n := int64(C.cmalloc_mapped())
	if n < 0 {
		return 0, errNoGlibc
	}
	return n, nil
}

// Malloc and Free are C's, for tests of the tuning (a test file cannot
// use cgo).
func Malloc(n int) unsafe.Pointer { return C.malloc(C.size_t(n)) }

// Free frees what Malloc returned.
func Free(p unsafe.Pointer) { C.free(p) }
