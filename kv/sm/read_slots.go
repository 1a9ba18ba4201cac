package sm

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/semaphore"

	"synod/kv/proto"
)

// Read slots: a bound on the memory reads pin inside Pebble.
//
// A read holds the block its value sits in until it has copied the value
// (Get's closer, an iterator's current block), and a block holds a whole
// value: with megabyte values every read in progress pins a megabyte of
// Pebble's manual memory, outside what the block cache's size bounds once
// the cache is full. Reads had no bound but the server's request limits:
// 1,024 readers of megabyte values on a node with a 192 MiB budget held
// 426 table iterators at once, and the node's resident set reached
// 346 MiB (anonymous memory 310 MiB, the Go heap 62 MiB of it).
//
// So client reads take slots before they touch Pebble and give them back
// once they have copied what they read: a GET (and the quota check's
// ValueLen) one slot, which pins at most ReadSlotPinBytes (one block
// holding the largest value); a SCAN ScanReadSlots, because its iterator
// positions a block in each level of the LSM it reads (L0's sublevels and
// the levels below) and so may pin several. The slots are Options.ReadSlots
// (kvnode reserves ReadSlots*ReadSlotPinBytes of its memory budget for
// them: cmd/kvnode config_memory.go), so reads pin at most that much
// beyond the cache (a SCAN positioned in more than ScanReadSlots levels of
// megabyte values aside). Slots are granted in arrival order, a SCAN's all
// at once (golang.org/x/sync/semaphore: no two SCANs can each hold part of
// what the other needs).
//
// A read waits for its slots at most until its context ends (the request's
// deadline: kv/server ends it request_timeout, 5 s by default, after the
// frame arrived; the wire carries no client deadline): then it is answered
// UNAVAILABLE without touching Pebble, so requests past their time do not
// hold the queue. The apply loop's
// own reads (CAS, sizes), snapshot streams and staging take no slot: the
// apply loop must never wait behind client reads. The quota check's
// ValueLen waits without a deadline (it is on the leader's write path,
// after the write was admitted, and its read is one block).

const (
	// ReadSlotsMax bounds the read slots whatever the memory: more reads
	// in Pebble at once than this gain nothing on the cores a node runs
	// on (measured on 2; a machine with many more cores may want more).
	ReadSlotsMax = 64
	// ReadSlotsMin is the least: small stores still read in parallel,
	// and a SCAN's ScanReadSlots always fit.
	ReadSlotsMin = 4
	// ScanReadSlots is what a SCAN takes (at most every slot there is).
	ScanReadSlots = 4
	// ReadSlotPinBytes is what one slot may pin: a data block holding the
	// largest value with its key, beside what fills a block before it
	// (Pebble's target block size, 4 KiB by default, rounded up to 64 KiB
	// with the block's restart points and trailer).
	ReadSlotPinBytes = proto.ValueBytesMax + proto.KeyBytesMax + 64<<10
	// readSlotsCacheDivisor: with no ReadSlots given, the slots pin at
	// most 1/readSlotsCacheDivisor of the cache.
	readSlotsCacheDivisor = 2
)

// errReadSlotWait is a read whose context ended while it waited for a
// read slot; it wraps the context's error.
var errReadSlotWait = errors.New("sm: the request's deadline passed while it waited for a read slot (the node is saturated with reads)")

// readSlotsFor is the number of read slots when Options.ReadSlots is 0:
// half a block cache of cacheBytes (0: Pebble's default cache, taken as
// 8 MiB) in ReadSlotPinBytes, within ReadSlotsMin..ReadSlotsMax.
func readSlotsFor(cacheBytes int64) int {
	if cacheBytes <= 0 {
		cacheBytes = 8 << 20
	}
	return clampReadSlots(cacheBytes / readSlotsCacheDivisor / ReadSlotPinBytes)
}

// ReadSlotsFor is the number of read slots that pin at most pinBytes,
// within ReadSlotsMin..ReadSlotsMax: what kvnode's memory plan gives the
// state machine (Options.ReadSlots) for the bytes it reserves.
func ReadSlotsFor(pinBytes int64) int { return clampReadSlots(pinBytes / ReadSlotPinBytes) }

func clampReadSlots(n int64) int { return int(max(ReadSlotsMin, min(ReadSlotsMax, n))) }

// readSlots is the weighted semaphore of reads inside Pebble.
type readSlots struct {
	sem *semaphore.Weighted
	n   int64
}

func newReadSlots(n int) readSlots {
	return readSlots{sem: semaphore.NewWeighted(int64(n)), n: int64(n)}
}

// weight is what a read of w slots takes: every slot at most.
func (r readSlots) weight(w int64) int64 { return min(w, r.n) }

// take waits for w slots until ctx ends (errReadSlotWait).
func (r readSlots) take(ctx context.Context, w int64) error {
	if err := r.sem.Acquire(ctx, r.weight(w)); err != nil {
		return fmt.Errorf("%w: %w", errReadSlotWait, err)
	}
	return nil
}

// give returns w slots.
func (r readSlots) give(w int64) { r.sem.Release(r.weight(w)) }
