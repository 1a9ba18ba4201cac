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
// Entries are stored in Pebble next to the data, in the same batch, so the
// table survives restarts and travels in snapshots. Eviction (past
// ClientsMax) drops the entries with the oldest last-applied slot; the
// choice depends only on applied state, so every replica evicts the same.
//
// Stored value of an entry:
//
//	floor u64 | last slot u64 | count u16 | count x (seq u64 | status u8 | failed op u32)
type clientKey struct {
	tenant tenants.ID
	client uint64
}

type clientEntry struct {
	floor    uint64 // Invariant: every key of results is >= floor
	lastSlot uint64
	results  map[uint64]cachedResult
}

type cachedResult struct {
	status   proto.Status
	failedOp uint32
}

func clientStoreKey(k clientKey) []byte {
	b := bytes.Clone(clientsKeyPrefix)
	b = binary.BigEndian.AppendUint32(b, uint32(k.tenant))
	return binary.BigEndian.AppendUint64(b, k.client)
}

func (e *clientEntry) encode() []byte {
	seqs := make([]uint64, 0, len(e.results))
	for s := range e.results {
		seqs = append(seqs, s)
	}
	slices.Sort(seqs)
	b := make([]byte, 0, 18+13*len(seqs))
	b = binary.BigEndian.AppendUint64(b, e.floor)
	b = binary.BigEndian.AppendUint64(b, e.lastSlot)
	b = binary.BigEndian.AppendUint16(b, uint16(len(seqs)))
	for _, s := range seqs {
		r := e.results[s]
		b = binary.BigEndian.AppendUint64(b, s)
		b = append(b, byte(r.status))
		b = binary.BigEndian.AppendUint32(b, r.failedOp)
	}
	return b
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
	e.results = make(map[uint64]cachedResult, n)
	for i := 0; i < n; i++ {
		p := b[18+13*i:]
		e.results[binary.BigEndian.Uint64(p)] = cachedResult{status: proto.Status(p[8]), failedOp: binary.BigEndian.Uint32(p[9:])}
	}
	return e, nil
}

func loadClients(db *pebble.DB) (map[clientKey]*clientEntry, error) {
	upper := bytes.Clone(clientsKeyPrefix)
	upper[len(upper)-1]++
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: clientsKeyPrefix, UpperBound: upper})
	if err != nil {
		return nil, fmt.Errorf("sm: iterating client table: %w", err)
	}
	defer it.Close()
	out := map[clientKey]*clientEntry{}
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) != len(clientsKeyPrefix)+12 {
			return nil, fmt.Errorf("sm: client table key of %d bytes", len(k))
		}
		ck := clientKey{tenant: tenants.ID(binary.BigEndian.Uint32(k[len(clientsKeyPrefix):])),
			client: binary.BigEndian.Uint64(k[len(clientsKeyPrefix)+4:])}
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, fmt.Errorf("sm: reading client entry: %w", err)
		}
		e, err := decodeClientEntry(v)
		if err != nil {
			return nil, err
		}
		out[ck] = e
	}
	if err := it.Error(); err != nil {
		return nil, fmt.Errorf("sm: iterating client table: %w", err)
	}
	return out, nil
}

// lookup returns the remembered result of (k, seq), or a SEQUENCE_STALE
// result, and whether the write must be skipped.
func (s *SM) lookup(k clientKey, seq uint64) (Result, bool) {
	e := s.clients[k]
	if e == nil {
		return Result{}, false
	}
	if seq < e.floor {
		return Result{Status: proto.StatusSequenceStale,
			Message: fmt.Sprintf("seq %d is below the client's remembered floor %d", seq, e.floor)}, true
	}
	if r, ok := e.results[seq]; ok {
		return Result{Status: r.status, FailedOp: r.failedOp}, true
	}
	return Result{}, false
}

// record remembers res for (k, seq) applied in slot and writes the entry
// into batch. It evicts old entries when the table is full.
func (s *SM) record(batch *pebble.Batch, slot uint64, k clientKey, seq, firstUnacked uint64, res Result) error {
	e := s.clients[k]
	if e == nil {
		if len(s.clients) >= ClientsMax {
			if err := s.evict(batch); err != nil {
				return err
			}
		}
		e = &clientEntry{results: map[uint64]cachedResult{}}
		s.clients[k] = e
	}
	e.lastSlot = slot
	e.results[seq] = cachedResult{status: res.Status, failedOp: res.FailedOp}
	if firstUnacked > e.floor {
		e.floor = firstUnacked
	}
	for len(e.results) > ResultsPerClientMax {
		lowest := uint64(0)
		first := true
		for q := range e.results {
			if first || q < lowest {
				lowest, first = q, false
			}
		}
		if lowest+1 > e.floor {
			e.floor = lowest + 1
		}
		delete(e.results, lowest)
	}
	for q := range e.results {
		if q < e.floor {
			delete(e.results, q)
		}
	}
	if err := batch.Set(clientStoreKey(k), e.encode(), nil); err != nil {
		return fmt.Errorf("sm: writing client entry: %w", err)
	}
	return nil
}

// evict drops the clientsEvictBatch entries applied longest ago (ties by
// tenant, then client id, so that every replica picks the same).
func (s *SM) evict(batch *pebble.Batch) error {
	keys := make([]clientKey, 0, len(s.clients))
	for k := range s.clients {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b clientKey) int {
		ea, eb := s.clients[a], s.clients[b]
		switch {
		case ea.lastSlot != eb.lastSlot:
			return cmpU64(ea.lastSlot, eb.lastSlot)
		case a.tenant != b.tenant:
			return cmpU64(uint64(a.tenant), uint64(b.tenant))
		}
		return cmpU64(a.client, b.client)
	})
	for _, k := range keys[:min(clientsEvictBatch, len(keys))] {
		delete(s.clients, k)
		if err := batch.Delete(clientStoreKey(k), nil); err != nil {
			return fmt.Errorf("sm: evicting client entry: %w", err)
		}
	}
	return nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
