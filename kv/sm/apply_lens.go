package sm

// Lengths the apply path remembers. Every applied PUT and DELETE needs the
// length of the value it replaces, for the usage accounting
// (slotBatch.valueLen), and reading it with a Pebble Get searched the
// memtables and built an iterator over every L0 table the key's range
// overlapped: in an open-loop run of 10,000 small puts a second, that Get
// was 18-28 % of each follower's CPU and 9-14 % of the leader's
// (docs/benchmarking.md, "The old value's length from memory"). A key
// that is overwritten tends to be overwritten again, so the SM keeps the
// lengths of the keys it overwrote last.
//
// Invariant (under SM.mu): an entry is the length of its key's value in
// the applied state, -1 for a key that is not there. Only Apply changes
// the applied state key by key, and once its batch has committed it
// records the new length of every key it wrote that the table holds
// (and of the overwritten keys it adds); a swap of the whole state (a
// restore) forgets every entry, and Open starts empty. So a remembered
// length is exactly what a Get would return, and every replica decides
// the same whatever its table holds: the table saves the read, it never
// changes an answer.
//
// Bounded by applyLensBytesMax (keys and the map's own cost); past it,
// arbitrary entries are forgotten to make room.

const (
	// applyLensBytesMax bounds the table: each entry costs its key (at
	// most proto.KeyBytesMax plus the tenant prefix) and
	// applyLenEntryBytes. 4 MiB hold about 60,000 entries of 20-byte
	// keys. Part of the Go heap, inside the memory budget's fixed
	// overhead (kv/README.md, "Memory").
	applyLensBytesMax = 4 << 20
	// applyLenEntryBytes is an entry's cost beside its key's bytes: the
	// string header, the length, and the map's slot and control byte.
	applyLenEntryBytes = 40
)

// applyLens is the SM's table of the applied state's value lengths (the
// comment above). Not safe for concurrent use: SM.mu guards it.
type applyLens struct {
	lens  map[string]int // data key -> value length, -1: absent
	bytes int            // Invariant: sum of len(key)+applyLenEntryBytes <= applyLensBytesMax
}

// lookup returns the remembered length of key's value (-1: absent).
func (a *applyLens) lookup(key []byte) (int, bool) {
	n, ok := a.lens[string(key)]
	return n, ok
}

// applied records the lengths a committed slot left (written; -1:
// deleted) for the keys in remember: every key it wrote that the table
// held, and every key it overwrote (present before the slot). A key
// written for the first time is not remembered: a load of new keys would
// only churn the table, and a key that is overwritten once is likely to
// be overwritten again.
func (a *applyLens) applied(written map[string]int, remember []string) {
	if testingApplyLensOff || len(remember) == 0 {
		return
	}
	if a.lens == nil {
		a.lens = make(map[string]int, len(remember))
	}
	for _, k := range remember {
		n := written[k]
		if _, ok := a.lens[k]; ok {
			if !testingApplyLensKeepsOld {
				a.lens[k] = n
			}
			continue
		}
		cost := len(k) + applyLenEntryBytes
		if cost > applyLensBytesMax {
			continue
		}
		for a.bytes+cost > applyLensBytesMax {
			for old := range a.lens {
				delete(a.lens, old)
				a.bytes -= len(old) + applyLenEntryBytes
				break
			}
		}
		a.lens[k] = n
		a.bytes += cost
	}
}

// reset forgets every length: the whole applied state was swapped.
func (a *applyLens) reset() {
	if testingApplyLensKeptOnSwap {
		return
	}
	clear(a.lens)
	a.bytes = 0
}

// Planted bugs for the tests that prove the usage checks catch a stale
// table: testingApplyLensKeptOnSwap keeps the lengths across a restore;
// testingApplyLensKeepsOld leaves a remembered key's old length after an
// overwrite. testingApplyLensOff turns the table off (the reads it saves
// come back), for the benchmark.
var testingApplyLensKeptOnSwap, testingApplyLensKeepsOld, testingApplyLensOff bool
