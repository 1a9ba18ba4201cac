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
// 346 MiB (anonymous memory 310 MiB, the Go heap 62 MiB of it). So client
// reads (GET, SCAN, and the quota check's ValueLen) take a slot before they
// touch Pebble and give it back once they have copied what they read: at
// most readSlotsFor(CacheBytes) of them. A GET pins one block, so GETs pin
// at most about half the cache's size in megabyte blocks beyond it (more
// with the ReadSlotsMin floor under an 8 MiB cache); a SCAN's iterator
// holds a block in each level it positions, so a SCAN of megabyte values
// may pin several. That memory is not reserved in kvnode's memory plan
// (it came out of the slack of the 192 MiB runs). The apply loop's own
// reads (CAS, sizes), snapshot streams and staging take no slot: the apply
// loop must never wait behind client reads. A read that finds no slot
// waits for one, whatever its client's deadline (reads are short; the
// wait is the backlog a saturated store has anyway).

const (
	// ReadSlotsMax bounds the read slots whatever the cache: more reads
	// in Pebble at once than this gain nothing on the cores a node runs
	// on (measured on 2; a machine with many more cores may want more).
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
