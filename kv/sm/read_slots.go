package sm

import (
	"synod/kv/proto"
)

// Read slots: a bound on the reads inside Pebble at once.
//
// A read holds the block its value sits in until it has copied the value
// (Get's closer, an iterator's current block), and a block holds a whole
// value: with megabyte values every read in progress pins a megabyte of
// Pebble's manual memory, outside what the block cache's size bounds once
// the cache is full. Reads had no bound but the server's request limits:
// 1,024 readers of megabyte values on a node with a 192 MiB budget held
// 426 table iterators at once, and the node's resident set reached
// 346 MiB (anonymous memory 310 MiB, the Go heap 62 MiB of it). So GETs and
// SCANs take a slot before they touch Pebble and give it back once they
// have copied what they read: at most readSlotsFor(CacheBytes) of them,
// which pin at most half the cache's size in megabyte blocks beyond it.
// A read that finds no slot waits for one (reads are short; the wait is
// the backlog a saturated store has anyway).

const (
	// ReadSlotsMax bounds the read slots whatever the cache: 2 cores
	// gain nothing from more concurrent reads.
	ReadSlotsMax = 64
	// ReadSlotsMin is the least: small caches still read in parallel.
	ReadSlotsMin = 4
	// readSlotBlockBytes is what one read may pin: a block holding the
	// largest value.
	readSlotBlockBytes = proto.ValueBytesMax
)

// readSlotsFor is the number of read slots for a block cache of
// cacheBytes (0: Pebble's default cache, taken as 8 MiB).
func readSlotsFor(cacheBytes int64) int {
	if cacheBytes <= 0 {
		cacheBytes = 8 << 20
	}
	return int(max(ReadSlotsMin, min(ReadSlotsMax, cacheBytes/2/readSlotBlockBytes)))
}

// readSlots is the semaphore of reads inside Pebble.
type readSlots chan struct{}

// take waits for a slot.
func (r readSlots) take() { r <- struct{}{} }

// give returns a slot.
func (r readSlots) give() { <-r }
