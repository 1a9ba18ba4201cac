//go:build !amd64

package pmem

import "sync/atomic"

var fenceWord atomic.Uint64

// FlushInstruction names the cache-line flush dax mode uses: none off
// amd64, where dax mode is refused.
func FlushInstruction() string { return "none" }

// flushLines has no cache-line flush to use off amd64.
func flushLines(addr, n uintptr) bool { return false }

// storeFence is a full barrier: an atomic read-modify-write.
func storeFence() { fenceWord.Add(1) }
