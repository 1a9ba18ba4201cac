package sm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"synod/tenants"
)

// Storage accounting. The SM keeps, for every tenant, how many keys it
// stores and what they cost (Usage), exactly and deterministically: every
// Apply that sets or deletes a key adds or takes away the key's cost in the
// same Pebble batch, so every replica at the same applied slot holds the
// same figures, and a snapshot carries them (they are ordinary metadata
// keys). Admission reads them to enforce a tenant's storage quota
// (kv/space); the state machine itself never refuses a committed write for
// space, since replicas configured differently would then disagree.
//
// A key costs len(user key) + len(value) + KeyOverheadBytes: the overhead
// stands for the tenant prefix and Pebble's per-key trailer, so a tenant
// cannot store unbounded numbers of empty values for free.
//
// Layout (part of the on-disk format):
//
//	0x00000000 | "u" | tenant u32 BE   bytes u64 BE | keys u64 BE
//	0x00000000 | "U"                   u64 BE: the applied slot the "u" entries are exact at
//
// Every Apply writes the marker with the applied slot, in the same batch.
// A store whose marker is absent (written before the accounting existed)
// or names another slot than the applied one (a binary without the
// accounting applied writes after installing a snapshot that carried the
// entries, during a rolling upgrade) has entries that cannot be trusted:
// Open (and the install of a snapshot) then counts every tenant's keys
// once and writes the entries and the marker in one batch.
const KeyOverheadBytes = 16

// Usage is what one tenant stores.
type Usage struct {
	Bytes uint64 // sum of the costs of its keys (see KeyOverheadBytes)
	Keys  uint64 // keys stored
}

var (
	usageKeyPrefix  = []byte("\x00\x00\x00\x00u")
	usageCountedKey = []byte("\x00\x00\x00\x00U")
)

// usageEntryBytes is the size of a stored Usage.
const usageEntryBytes = 16

// KeyCost is what storing a value of valueLen bytes under a user key of
// keyLen bytes costs in a tenant's usage.
func KeyCost(keyLen, valueLen int) int64 {
	return int64(keyLen) + int64(valueLen) + KeyOverheadBytes
}

// appendUsageKey appends tenant t's usage key to dst.
func appendUsageKey(dst []byte, t tenants.ID) []byte {
	return binary.BigEndian.AppendUint32(append(dst, usageKeyPrefix...), uint32(t))
}

// appendUsage appends u's stored form to dst.
func appendUsage(dst []byte, u Usage) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(dst, u.Bytes), u.Keys)
}

func decodeUsage(v []byte) (Usage, error) {
	if len(v) != usageEntryBytes {
		return Usage{}, fmt.Errorf("usage entry of %d bytes, want %d", len(v), usageEntryBytes)
	}
	return Usage{Bytes: binary.BigEndian.Uint64(v), Keys: binary.BigEndian.Uint64(v[8:])}, nil
}

// testingUsageForgetsOldValue plants a bug for the test of the usage
// check: an overwrite does not take the old value's cost off.
var testingUsageForgetsOldValue bool

// usageDelta is what one Apply changes in one tenant's usage.
type usageDelta struct{ bytes, keys int64 }

// usageTable is the in-memory copy of the stored entries. Admission reads
// it on every write while Apply updates it, so reads take no lock: each
// tenant's figures are an immutable *Usage in a sync.Map, replaced whole.
// Only Apply and load write it (serialised by the SM's mu).
type usageTable struct {
	m sync.Map // tenants.ID -> *Usage
}

func (t *usageTable) get(id tenants.ID) Usage {
	if v, ok := t.m.Load(id); ok {
		return *v.(*Usage)
	}
	return Usage{}
}

// set installs u for id (an empty usage removes the tenant).
func (t *usageTable) set(id tenants.ID, u Usage) {
	if u == (Usage{}) {
		t.m.Delete(id)
		return
	}
	t.m.Store(id, &u)
}

func (t *usageTable) replace(m map[tenants.ID]Usage) {
	t.m.Range(func(k, _ any) bool {
		if _, keep := m[k.(tenants.ID)]; !keep {
			t.m.Delete(k)
		}
		return true
	})
	for id, u := range m {
		t.set(id, u)
	}
}

// each calls f for every tenant with figures.
func (t *usageTable) each(f func(tenants.ID, Usage)) {
	t.m.Range(func(k, v any) bool {
		f(k.(tenants.ID), *v.(*Usage))
		return true
	})
}

// Usage returns what tenant stores as of the last Apply.
func (s *SM) Usage(tenant tenants.ID) Usage { return s.usage.get(tenant) }

// StoredBytes is the sum of every tenant's usage bytes: a bound of what
// rewriting the whole store produces.
func (s *SM) StoredBytes() uint64 {
	var n uint64
	s.usage.each(func(_ tenants.ID, u Usage) { n += u.Bytes })
	return n
}

// Usages returns every tenant's usage as of the last Apply (tenants that
// never stored anything are absent).
func (s *SM) Usages() map[tenants.ID]Usage {
	out := map[tenants.ID]Usage{}
	s.usage.each(func(id tenants.ID, u Usage) { out[id] = u })
	return out
}

// Answered reports whether the exactly-once table already decides the
// write (client, seq) of tenant: a remembered result, or SEQUENCE_STALE.
// Such a write is answered from the table and never applied again, so
// admission must not refuse it for space.
func (s *SM) Answered(tenant tenants.ID, client, seq uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.clients == nil {
		return false
	}
	_, ok := s.lookup(clientKey{tenant: tenant, client: client}, seq)
	return ok
}

// Garbage is how many values Apply has deleted or replaced since Open or
// the last Compact: space Pebble gives back only when a compaction
// rewrites their tables.
func (s *SM) Garbage() uint64 { return s.garbage.Load() }

// Compact compacts the whole store, giving back the space of deleted and
// replaced values, and resets Garbage. Reads and applies go on meanwhile;
// a restore's swap and Close cancel it (stopCompaction).
func (s *SM) Compact() error {
	s.compactMu.Lock()
	defer s.compactMu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	s.compactCancel.Store(&cancel)
	defer func() {
		s.compactCancel.Store(nil)
		cancel()
	}()
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.dbClosed {
		return ErrClosed
	}
	g := s.garbage.Load()
	if err := s.db.Compact(ctx, prefixEnd(metaPrefix), keyspaceEnd, true); err != nil {
		return fmt.Errorf("sm: compacting: %w", err)
	}
	s.garbage.Add(-g)
	return nil
}

// stopCompaction cancels a Compact in progress (before taking dbMu to
// close or swap the database, which would otherwise wait for it).
func (s *SM) stopCompaction() {
	if c := s.compactCancel.Load(); c != nil {
		(*c)()
	}
}

// applyDelta returns u changed by d. A result below zero means the stored
// figures were wrong; it stops at zero (every replica does the same).
func applyDelta(u Usage, d usageDelta) Usage {
	add := func(v uint64, by int64) uint64 {
		if by < 0 && uint64(-by) > v {
			return 0
		}
		return uint64(int64(v) + by)
	}
	return Usage{Bytes: add(u.Bytes, d.bytes), Keys: add(u.Keys, d.keys)}
}

// slotBatch is one Apply's batch and what it has written so far: the
// length of each value set in it (-1: deleted), so that the accounting
// reads a key's current length from there when the slot wrote it, from
// the SM's remembered lengths when they hold the key (apply_lens.go), and
// from the database otherwise. (Reading through an indexed batch costs
// an iterator per read, about twice a database Get.)
type slotBatch struct {
	batch *pebble.Batch
	db    *pebble.DB
	lens  *applyLens // the applied state's lengths, before this slot
	// remember: the keys the slot wrote that lens holds or whose value
	// was there before the slot, each once; lens records their new
	// lengths once the slot commits. Keys written for the first time are
	// left out: a load of new keys would only churn the table.
	remember []string
	written  map[string]int
	garbage  uint64 // values the slot deleted or replaced (SM.Garbage)
	// dirty: the client entries the slot changed, each once, in the order
	// first changed (SM.writeDirty writes them).
	dirty []dirtyEntry
}

// valueLen returns the length of key's current value as the slot sees it,
// whether the key is present, and whether lens must record the key's new
// length once the slot has written it (lens holds the key, or it was
// present before the slot).
func (w *slotBatch) valueLen(key []byte) (n int, ok, remember bool, err error) {
	if n, ok := w.written[string(key)]; ok {
		return n, n >= 0, false, nil
	}
	if w.lens != nil {
		if n, ok := w.lens.lookup(key); ok {
			return max(n, 0), n >= 0, true, nil
		}
	}
	n, ok, err = storedValueLen(w.db, key)
	return n, ok, ok && w.lens != nil, err
}

// wrote records that the slot left n bytes under key (-1: deleted).
func (w *slotBatch) wrote(key []byte, n int, remember bool) {
	k := string(key)
	w.written[k] = n
	if remember {
		w.remember = append(w.remember, k)
	}
}

// storedValueLen returns the length of key's value in db and whether it
// is present, without copying the value.
func storedValueLen(db *pebble.DB, key []byte) (int, bool, error) {
	v, closer, err := db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("sm: reading %x: %w", key, err)
	}
	n := len(v)
	closer.Close()
	return n, true, nil
}

// set writes value under dk and records the change of the tenant's usage
// in d: the old value's cost (if any) comes off, the new one's goes on.
func (w *slotBatch) set(dk, value []byte, d *usageDelta) error {
	oldLen, ok, remember, err := w.valueLen(dk)
	if err != nil {
		return err
	}
	userKey := len(dk) - len(metaPrefix)
	if ok && !testingUsageForgetsOldValue {
		d.bytes -= KeyCost(userKey, oldLen)
		d.keys--
		w.garbage++
	}
	d.bytes += KeyCost(userKey, len(value))
	d.keys++
	w.wrote(dk, len(value), remember)
	return w.batch.Set(dk, value, nil)
}

// delete deletes dk and takes its cost off d when it was present.
func (w *slotBatch) delete(dk []byte, d *usageDelta) error {
	oldLen, ok, remember, err := w.valueLen(dk)
	if err != nil {
		return err
	}
	if !ok {
		return nil // nothing to delete: no tombstone either
	}
	d.bytes -= KeyCost(len(dk)-len(metaPrefix), oldLen)
	d.keys--
	w.garbage++
	w.wrote(dk, -1, remember)
	return w.batch.Delete(dk, nil)
}

// usageUpdate is one tenant's new usage, installed once the batch commits.
type usageUpdate struct {
	id tenants.ID
	u  Usage
}

// commitUsage adds the batch's usage entries for the tenants deltas
// changed and returns the updates Apply installs once the batch commits
// (installUsage). Only Apply changes the table, under s.mu.
func (s *SM) commitUsage(batch *pebble.Batch, deltas map[tenants.ID]usageDelta) ([]usageUpdate, error) {
	if len(deltas) == 0 {
		return nil, nil
	}
	ups := make([]usageUpdate, 0, len(deltas))
	var buf [5 + 4 + usageEntryBytes]byte // usageKeyPrefix, tenant, entry
	for id, d := range deltas {
		u := applyDelta(s.usage.get(id), d)
		ups = append(ups, usageUpdate{id, u})
		key := appendUsageKey(buf[:0], id)
		if u == (Usage{}) {
			if err := batch.Delete(key, nil); err != nil { // Delete copies key
				return nil, err
			}
			continue
		}
		if err := batch.Set(key, appendUsage(key[len(key):], u), nil); err != nil { // Set copies both
			return nil, err
		}
	}
	return ups, nil
}

// installUsage installs the updates of a committed batch.
func (s *SM) installUsage(ups []usageUpdate) {
	if len(ups) == 0 {
		return
	}
	for _, up := range ups {
		s.usage.set(up.id, up.u)
	}
}

// setApplied writes the applied slot and the usage marker saying the
// entries are exact at it (every batch that advances the slot).
func setApplied(batch *pebble.Batch, slot uint64) error {
	v := binary.BigEndian.AppendUint64(nil, slot)
	if err := batch.Set(appliedKey, v, nil); err != nil {
		return err
	}
	return batch.Set(usageCountedKey, v, nil)
}

// loadUsage reads the usage entries of a store whose applied slot is
// applied, counting them first when the marker does not vouch for them at
// that slot.
func loadUsage(db *pebble.DB, applied uint64) (map[tenants.ID]Usage, error) {
	v, closer, err := db.Get(usageCountedKey)
	switch {
	case err == pebble.ErrNotFound:
		return countUsage(db, applied)
	case err != nil:
		return nil, fmt.Errorf("sm: reading the usage marker: %w", err)
	}
	exact := len(v) == 8 && binary.BigEndian.Uint64(v) == applied
	closer.Close()
	if !exact {
		return countUsage(db, applied)
	}
	m := map[tenants.ID]Usage{}
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: usageKeyPrefix, UpperBound: prefixEnd(usageKeyPrefix)})
	if err != nil {
		return nil, fmt.Errorf("sm: usage iterator: %w", err)
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) != len(usageKeyPrefix)+4 {
			return nil, fmt.Errorf("sm: usage key %x of %d bytes", k, len(k))
		}
		u, err := decodeUsage(it.Value())
		if err != nil {
			return nil, fmt.Errorf("sm: usage key %x: %w", k, err)
		}
		m[tenants.ID(binary.BigEndian.Uint32(k[len(usageKeyPrefix):]))] = u
	}
	return m, it.Error()
}

// countUsage counts every tenant's keys and writes the entries and the
// marker in one batch. It changes nothing the replicas disagree on: the
// entries are a function of the data.
func countUsage(db *pebble.DB, applied uint64) (map[tenants.ID]Usage, error) {
	m, err := tallyUsage(db)
	if err != nil {
		return nil, err
	}
	batch := db.NewBatch()
	defer batch.Close()
	// Entries of tenants that no longer store anything go.
	if err := batch.DeleteRange(usageKeyPrefix, prefixEnd(usageKeyPrefix), nil); err != nil {
		return nil, err
	}
	for id, u := range m {
		if err := batch.Set(appendUsageKey(nil, id), appendUsage(nil, u), nil); err != nil {
			return nil, err
		}
	}
	if err := batch.Set(usageCountedKey, binary.BigEndian.AppendUint64(nil, applied), nil); err != nil {
		return nil, err
	}
	// Without sync (Pebble's WAL is off): a crash before the next flush
	// loses the count, and the next Open counts again.
	if err := batch.Commit(pebble.NoSync); err != nil {
		return nil, fmt.Errorf("sm: writing the usage count: %w", err)
	}
	return m, nil
}

// tallyUsage counts every tenant's keys in r.
func tallyUsage(r pebble.Reader) (map[tenants.ID]Usage, error) {
	m := map[tenants.ID]Usage{}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: prefixEnd(metaPrefix), UpperBound: keyspaceEnd})
	if err != nil {
		return nil, fmt.Errorf("sm: counting usage: %w", err)
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		id := tenants.ID(binary.BigEndian.Uint32(k))
		u := m[id]
		u.Bytes += uint64(KeyCost(len(k)-len(metaPrefix), len(it.Value())))
		u.Keys++
		m[id] = u
	}
	if err := it.Error(); err != nil {
		return nil, fmt.Errorf("sm: counting usage: %w", err)
	}
	return m, nil
}

// prefixEnd is the first key after every key starting with p (p must not
// be all 0xff).
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	panic("sm: prefixEnd of all 0xff")
}
