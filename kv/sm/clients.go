package sm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"synod/kv/proto"
	"synod/tenants"
)

// The exactly-once table. Each (tenant, client id) has an entry that
// remembers the results of its recent writes by sequence number:
//
//   - a write whose seq has a remembered result is not applied again; the
//     remembered result (status and failed-op index, no value) is returned;
//   - a write whose seq is below the entry's floor gets SEQUENCE_STALE: the
//     client has acknowledged it, or it is older than ResultsPerClientMax
//     writes, so its result is gone and applying it again could break
//     exactly-once;
//   - every write carries FirstUnacked, the client's lowest unanswered
//     sequence; the floor rises to it and results below are dropped.
//
// Quotas and eviction. The table is divided between tenants: each tenant
// has its own share (Options.ClientsMax, ClientsPerTenantDefault when its
// config names none), and one tenant's clients never evict another
// tenant's. A tenant that needs a new entry while at its share evicts its
// own least-recently-applied entries (by last applied slot, then client
// id), max(1, share/16) at a time.
//
// Tombstones. An evicted entry is not simply forgotten: it leaves a
// tombstone, the client's next sequence (one above the highest sequence it
// ever had applied, and at least its floor). A write of a tombstoned client
//
//   - with seq below the tombstone gets SEQUENCE_STALE and is not applied:
//     it is a retry (or a late pipelined write) of a sequence the table can
//     no longer answer for, and "may or may not have applied" is the only
//     safe answer;
//   - with seq at or above it is new: it is applied and the client gets a
//     fresh entry whose floor is the tombstone, so a client that goes on
//     writing with rising sequences after its eviction keeps working.
//
// A tenant keeps at most TombstonesPerShare times its share of tombstones;
// past that its oldest (by the evicted entry's last applied slot, then
// client id) are dropped, evictBatch at a time. Only then is a client
// forgotten: a write from a client with neither an entry nor a tombstone
// is a new client's. When a client is forgotten, every entry of its tenant
// and at least 15/16 of the tenant's tombstones belong to clients that
// wrote at or after its last write, so a retried write is applied twice
// only if at least 15/16 x (1+TombstonesPerShare) x share other clients of
// the SAME tenant wrote between its first apply and the retry (16,320 for
// the default share). No other tenant can bring that about.
//
// Entries and tombstones are stored in Pebble next to the data, in the same
// batch as the write that changed them, so they survive restarts and travel
// in snapshots. Every choice above depends only on the applied commands and
// the shares, so replicas with the same shares evict, tombstone and forget
// the same clients at the same slot.
//
// Stored value of an entry (key 0x00000000 | "c" | tenant u32 | client u64):
//
//	floor u64 | last slot u64 | count u16 | count x (seq u64 | status u8 | failed op u32)
//
// Stored value of a tombstone (key 0x00000000 | "e" | tenant u32 | client u64):
//
//	next seq u64 | last slot u64
type clientKey struct {
	tenant tenants.ID
	client uint64
}

type clientEntry struct {
	floor    uint64 // Invariant: every seq in results is >= floor
	lastSlot uint64
	// results, in strictly increasing seq order. A slice and not a map
	// because a client's writes arrive in nearly increasing order: a new
	// result is appended, the floor drops a prefix, and encode walks it as
	// it is. With a map every applied write sorted up to
	// ResultsPerClientMax sequences (a third of a leader's CPU at 256
	// writes in flight on one connection).
	results []cachedResult
	// dirtySlot is the slot whose batch this entry is queued to be written
	// into (slotBatch.dirty), so that it is queued once per slot.
	dirtySlot uint64
}

type cachedResult struct {
	seq      uint64
	status   proto.Status
	failedOp uint32
}

// find returns the index of seq in e.results, or where it would go, and
// whether it is there.
func (e *clientEntry) find(seq uint64) (int, bool) {
	return slices.BinarySearchFunc(e.results, seq, func(r cachedResult, s uint64) int { return cmpU64(r.seq, s) })
}

// put remembers r, replacing a result of the same seq.
func (e *clientEntry) put(r cachedResult) {
	if n := len(e.results); n == 0 || e.results[n-1].seq < r.seq {
		e.results = append(e.results, r) // the usual case: the newest write
		return
	}
	i, ok := e.find(r.seq)
	if ok {
		e.results[i] = r
		return
	}
	e.results = slices.Insert(e.results, i, r)
}

// raiseFloor sets the floor to at least floor and drops the results below
// the floor (record never puts one there, since lookup answers those
// writes, but the invariant does not lean on it). Dropping reslices from
// the front; the next append past the backing array's end copies the live
// results into one twice their number, so an entry's memory stays within
// about twice ResultsPerClientMax results.
func (e *clientEntry) raiseFloor(floor uint64) {
	e.floor = max(e.floor, floor)
	i, _ := e.find(e.floor)
	e.results = e.results[i:]
}

// tombstone is what the table keeps of an evicted entry.
type tombstone struct {
	// next is the lowest sequence the client never had applied; every
	// lower one is answered SEQUENCE_STALE. Invariant: next >= 1.
	next     uint64
	lastSlot uint64 // the evicted entry's last applied slot: forgetting order
}

// tenantClients is one tenant's part of the table.
//
// Invariant: a client is never in both maps. Bounds: len(entries) <= share
// and len(tombs) <= TombstonesPerShare*share, restored by evict whenever
// the tenant adds a client (a table opened with a smaller share than it was
// written with shrinks at its tenant's next new client).
type tenantClients struct {
	entries map[uint64]*clientEntry
	tombs   map[uint64]tombstone
}

const tombstoneValueBytes = 16

func clientStoreKey(k clientKey) []byte { return tableKey(clientsKeyPrefix, k) }

func tombStoreKey(k clientKey) []byte { return tableKey(tombsKeyPrefix, k) }

func tableKey(prefix []byte, k clientKey) []byte {
	b := bytes.Clone(prefix)
	b = binary.BigEndian.AppendUint32(b, uint32(k.tenant))
	return binary.BigEndian.AppendUint64(b, k.client)
}

func (e *clientEntry) encode() []byte {
	b := make([]byte, 0, 18+13*len(e.results))
	b = binary.BigEndian.AppendUint64(b, e.floor)
	b = binary.BigEndian.AppendUint64(b, e.lastSlot)
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.results)))
	for _, r := range e.results {
		b = binary.BigEndian.AppendUint64(b, r.seq)
		b = append(b, byte(r.status))
		b = binary.BigEndian.AppendUint32(b, r.failedOp)
	}
	return b
}

// nextSeq is the tombstone of e: one above the highest sequence e ever had
// applied. Results below the floor are gone, but each was below the floor
// when dropped, so the floor covers them.
func (e *clientEntry) nextSeq() uint64 {
	next := max(e.floor, 1)
	if n := len(e.results); n > 0 {
		next = max(next, e.results[n-1].seq+1)
	}
	return next
}

func decodeClientEntry(b []byte) (*clientEntry, error) {
	if len(b) < 18 {
		return nil, fmt.Errorf("sm: client entry of %d bytes", len(b))
	}
	e := &clientEntry{floor: binary.BigEndian.Uint64(b), lastSlot: binary.BigEndian.Uint64(b[8:])}
	n := int(binary.BigEndian.Uint16(b[16:]))
	if n > ResultsPerClientMax || len(b) != 18+13*n {
		return nil, fmt.Errorf("sm: client entry with %d results in %d bytes", n, len(b))
	}
	e.results = make([]cachedResult, n)
	for i := range e.results {
		p := b[18+13*i:]
		r := cachedResult{seq: binary.BigEndian.Uint64(p), status: proto.Status(p[8]), failedOp: binary.BigEndian.Uint32(p[9:])}
		if r.seq < e.floor {
			return nil, fmt.Errorf("sm: client entry result seq %d below its floor %d", r.seq, e.floor)
		}
		if i > 0 && r.seq <= e.results[i-1].seq {
			return nil, fmt.Errorf("sm: client entry result seq %d after %d: not in increasing order", r.seq, e.results[i-1].seq)
		}
		e.results[i] = r
	}
	return e, nil
}

func (t tombstone) encode() []byte {
	b := make([]byte, 0, tombstoneValueBytes)
	b = binary.BigEndian.AppendUint64(b, t.next)
	return binary.BigEndian.AppendUint64(b, t.lastSlot)
}

func decodeTombstone(b []byte) (tombstone, error) {
	if len(b) != tombstoneValueBytes {
		return tombstone{}, fmt.Errorf("sm: client tombstone of %d bytes, want %d", len(b), tombstoneValueBytes)
	}
	t := tombstone{next: binary.BigEndian.Uint64(b), lastSlot: binary.BigEndian.Uint64(b[8:])}
	if t.next == 0 {
		return tombstone{}, fmt.Errorf("sm: client tombstone with next sequence 0")
	}
	return t, nil
}

// loadClients reads the table (entries and tombstones) from Pebble.
func loadClients(db *pebble.DB) (map[tenants.ID]*tenantClients, error) {
	out := map[tenants.ID]*tenantClients{}
	get := func(id tenants.ID) *tenantClients {
		tc := out[id]
		if tc == nil {
			tc = newTenantClients()
			out[id] = tc
		}
		return tc
	}
	err := scanTable(db, clientsKeyPrefix, "client entry", func(k clientKey, v []byte) error {
		e, err := decodeClientEntry(v)
		if err != nil {
			return err
		}
		get(k.tenant).entries[k.client] = e
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = scanTable(db, tombsKeyPrefix, "client tombstone", func(k clientKey, v []byte) error {
		t, err := decodeTombstone(v)
		if err != nil {
			return err
		}
		tc := get(k.tenant)
		if tc.entries[k.client] != nil {
			return fmt.Errorf("sm: client %d of tenant %d has both an entry and a tombstone", k.client, k.tenant)
		}
		tc.tombs[k.client] = t
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func newTenantClients() *tenantClients {
	return &tenantClients{entries: map[uint64]*clientEntry{}, tombs: map[uint64]tombstone{}}
}

// scanTable calls fn for every key under prefix (prefix | tenant u32 |
// client u64).
func scanTable(db *pebble.DB, prefix []byte, what string, fn func(clientKey, []byte) error) error {
	upper := bytes.Clone(prefix)
	upper[len(upper)-1]++
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("sm: iterating the client table: %w", err)
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) != len(prefix)+12 {
			return fmt.Errorf("sm: %s key of %d bytes", what, len(k))
		}
		ck := clientKey{tenant: tenants.ID(binary.BigEndian.Uint32(k[len(prefix):])),
			client: binary.BigEndian.Uint64(k[len(prefix)+4:])}
		v, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("sm: reading %s: %w", what, err)
		}
		if err := fn(ck, v); err != nil {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("sm: iterating the client table: %w", err)
	}
	return nil
}

// share returns tenant's share of the table.
func (s *SM) share(tenant tenants.ID) int {
	if n, ok := s.opts.ClientsMax[tenant]; ok {
		return n
	}
	if s.opts.ClientsDefault > 0 {
		return s.opts.ClientsDefault
	}
	return ClientsPerTenantDefault
}

// lookup returns the remembered result of (k, seq), or a SEQUENCE_STALE
// result, and whether the write must be skipped.
func (s *SM) lookup(k clientKey, seq uint64) (Result, bool) {
	tc := s.clients[k.tenant]
	if tc == nil {
		return Result{}, false
	}
	if e := tc.entries[k.client]; e != nil {
		if seq < e.floor {
			return Result{Status: proto.StatusSequenceStale,
				Message: fmt.Sprintf("seq %d is below the client's remembered floor %d", seq, e.floor)}, true
		}
		if i, ok := e.find(seq); ok {
			r := e.results[i]
			return Result{Status: r.status, FailedOp: r.failedOp}, true
		}
		return Result{}, false
	}
	if t, ok := tc.tombs[k.client]; ok && seq < t.next {
		return Result{Status: proto.StatusSequenceStale,
			Message: fmt.Sprintf("seq %d: the client was evicted from the exactly-once table at seq %d; its result is gone", seq, t.next)}, true
	}
	return Result{}, false
}

// record remembers res for (k, seq) applied in slot and queues the entry to
// be written into the slot's batch (writeDirty, once per slot however many
// of the slot's writes are the client's: an entry is up to 3.3 KiB). A
// client new to the table (or back from a tombstone) may first evict the
// tenant's oldest entries.
func (s *SM) record(w *slotBatch, slot uint64, k clientKey, seq, firstUnacked uint64, res Result) error {
	batch := w.batch
	tc := s.clients[k.tenant]
	if tc == nil {
		tc = newTenantClients()
		s.clients[k.tenant] = tc
	}
	e := tc.entries[k.client]
	if e == nil {
		floor := uint64(0)
		if t, ok := tc.tombs[k.client]; ok {
			// Back after an eviction: everything below the tombstone
			// stays stale (lookup let only seq >= t.next through).
			floor = t.next
			delete(tc.tombs, k.client)
			if err := batch.Delete(tombStoreKey(k), nil); err != nil {
				return fmt.Errorf("sm: dropping a client tombstone: %w", err)
			}
		}
		if share := s.share(k.tenant); len(tc.entries) >= share {
			if err := s.evict(batch, k.tenant, tc, share); err != nil {
				return err
			}
		}
		e = &clientEntry{floor: floor}
		tc.entries[k.client] = e
	}
	e.lastSlot = slot
	e.put(cachedResult{seq: seq, status: res.Status, failedOp: res.FailedOp})
	e.raiseFloor(firstUnacked)
	if over := len(e.results) - ResultsPerClientMax; over > 0 {
		// The oldest results go; the floor rises past them.
		e.raiseFloor(e.results[over-1].seq + 1)
	}
	if e.dirtySlot != slot {
		e.dirtySlot = slot
		w.dirty = append(w.dirty, dirtyEntry{k, e})
	}
	return nil
}

// dirtyEntry is a client entry that the slot changed.
type dirtyEntry struct {
	k clientKey
	e *clientEntry
}

// writeDirty writes the entries the slot changed into its batch, after the
// slot's last command. An entry the slot evicted after changing it is no
// longer the table's: evict already deleted its key, and writing it would
// bring it back.
func (s *SM) writeDirty(w *slotBatch) error {
	for _, d := range w.dirty {
		if tc := s.clients[d.k.tenant]; tc == nil || tc.entries[d.k.client] != d.e {
			continue
		}
		if err := w.batch.Set(clientStoreKey(d.k), d.e.encode(), nil); err != nil {
			return fmt.Errorf("sm: writing client entry: %w", err)
		}
	}
	return nil
}

// evict turns tenant's least-recently-applied entries into tombstones
// until it is evictBatch(share) below its share (ties by client id, so
// that every replica picks the same), then drops its oldest tombstones
// past TombstonesPerShare*share the same way.
func (s *SM) evict(batch *pebble.Batch, tenant tenants.ID, tc *tenantClients, share int) error {
	clients := make([]uint64, 0, len(tc.entries))
	for c := range tc.entries {
		clients = append(clients, c)
	}
	slices.SortFunc(clients, func(a, b uint64) int {
		if la, lb := tc.entries[a].lastSlot, tc.entries[b].lastSlot; la != lb {
			return cmpU64(la, lb)
		}
		return cmpU64(a, b)
	})
	n := len(clients) - share + evictBatch(share)
	for _, c := range clients[:min(max(n, 0), len(clients))] {
		e := tc.entries[c]
		k := clientKey{tenant: tenant, client: c}
		t := tombstone{next: e.nextSeq(), lastSlot: e.lastSlot}
		delete(tc.entries, c)
		tc.tombs[c] = t
		if err := batch.Delete(clientStoreKey(k), nil); err != nil {
			return fmt.Errorf("sm: evicting client entry: %w", err)
		}
		if err := batch.Set(tombStoreKey(k), t.encode(), nil); err != nil {
			return fmt.Errorf("sm: writing client tombstone: %w", err)
		}
	}
	s.evicted.Add(uint64(max(n, 0)))
	tombsMax := TombstonesPerShare * share
	if len(tc.tombs) <= tombsMax {
		return nil
	}
	old := make([]uint64, 0, len(tc.tombs))
	for c := range tc.tombs {
		old = append(old, c)
	}
	slices.SortFunc(old, func(a, b uint64) int {
		if la, lb := tc.tombs[a].lastSlot, tc.tombs[b].lastSlot; la != lb {
			return cmpU64(la, lb)
		}
		return cmpU64(a, b)
	})
	n = len(old) - tombsMax + evictBatch(tombsMax)
	for _, c := range old[:min(n, len(old))] {
		delete(tc.tombs, c)
		if err := batch.Delete(tombStoreKey(clientKey{tenant: tenant, client: c}), nil); err != nil {
			return fmt.Errorf("sm: dropping a client tombstone: %w", err)
		}
	}
	s.forgotten.Add(uint64(n))
	return nil
}

// evictBatch is how far below n eviction goes, so that a tenant flooding
// new client ids pays one sort per n/16 of them, not one per id.
func evictBatch(n int) int { return max(1, n/16) }

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
