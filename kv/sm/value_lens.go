package sm

import (
	"sync"
	"sync/atomic"
)

// Value lengths remembered. A GET whose answer has no room is refused
// before its value is copied (ReadResponseWithin's room check), but by
// then Pebble has read the value: for a large value, its whole data block,
// fetched, checksummed and decompressed. Clients that pipeline GETs of
// megabyte values and never read the answers fill their tenant's response
// budget, and every later GET of theirs is refused; in an outside tester's
// flood of six such tenants, 74 % of the leader's CPU went to decompressing
// megabyte blocks only to refuse them, and another tenant's GETs, one at a
// time, took 94 ms at the median against 0.9 ms without the flood.
//
// So the SM remembers the lengths of the large values it has read or
// written, and a GET with a room check asks the check with the remembered
// length first: refused, it is answered without a read slot or a read of
// the store. A GET the check admits still reads the store and is charged
// the length it read, so a remembered length only ever decides a refusal.
//
// Invariant: a remembered length is the length of the key's value in the
// applied state, except for the moment between a slot's commit and its
// writes' lengths being recorded here (Apply), when it may still be the
// previous value's: a GET then may be refused (THROTTLED: retry) for the
// length of a value just replaced, never served a wrong value.

const (
	// valueLenRememberedBytesMin is the smallest value whose length is
	// remembered: a smaller one costs about as much to read as to look up.
	valueLenRememberedBytesMin = 64 << 10
	// valueLensMax bounds the lengths remembered (each entry holds its key,
	// at most proto.KeyBytesMax plus the tenant prefix: about 1 MiB at most
	// in all). Past it an arbitrary entry is forgotten for each new one.
	valueLensMax = 1024
)

// valueLens is the SM's table of remembered value lengths (the package
// comment above). Safe for concurrent use; every GET asks it (lookup,
// generation), so those take no exclusive lock.
type valueLens struct {
	// gen counts the changes to the applied state (every applied slot and
	// every swap of the whole state): a read that began before one does
	// not record what it read. Changed under mu.
	gen  atomic.Uint64
	mu   sync.RWMutex
	lens map[string]int // data key -> value length; Invariant: len <= valueLensMax
}

// generation returns the current generation, taken by a read before it
// reads the store (record).
func (v *valueLens) generation() uint64 { return v.gen.Load() }

// lookup returns the remembered length of key's value.
func (v *valueLens) lookup(key []byte) (int, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	n, ok := v.lens[string(key)]
	return n, ok
}

// record remembers that key's value is n bytes long, as read by a read
// that took gen before it read: unless the applied state changed since.
func (v *valueLens) record(key []byte, n int, gen uint64) {
	if n < valueLenRememberedBytesMin {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.gen.Load() != gen {
		return
	}
	v.setLocked(string(key), n)
}

// applied records the lengths a committed slot wrote (-1: deleted) and
// starts a new generation.
func (v *valueLens) applied(written map[string]int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gen.Add(1)
	for k, n := range written {
		if n >= valueLenRememberedBytesMin {
			v.setLocked(k, n)
		} else {
			delete(v.lens, k)
		}
	}
}

// reset forgets every length (the whole state was swapped) and starts a
// new generation.
func (v *valueLens) reset() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gen.Add(1)
	clear(v.lens)
}

func (v *valueLens) setLocked(k string, n int) {
	if v.lens == nil {
		v.lens = make(map[string]int)
	}
	if _, ok := v.lens[k]; !ok && len(v.lens) >= valueLensMax {
		for old := range v.lens {
			delete(v.lens, old)
			break
		}
	}
	v.lens[k] = n
}
