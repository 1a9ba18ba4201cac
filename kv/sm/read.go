package sm

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"synod/kv/proto"
	"synod/tenants"
)

// Get returns tenant's value for key straight from Pebble (the applied
// state). A tenant reads only its own keyspace: the tenant id is the key
// prefix, so no user key can reach another tenant's keys.
func (s *SM) Get(tenant tenants.ID, key []byte) ([]byte, bool, error) {
	v, ok, _, err := s.getWithin(context.Background(), tenant, key, nil)
	return v, ok, err
}

// getWithin is Get that, with room set, calls room with the value's length
// before it copies the value: a non-nil answer from room is returned as
// refused, and nothing is copied (the caller's memory for answers is full).
// With a large value's length remembered (value_lens.go) it calls room
// with that length first, and a refusal then is returned before the store
// is read; admitted, it reads and calls room again with the length read.
// It waits for a read slot until ctx ends (errReadSlotWait).
func (s *SM) getWithin(ctx context.Context, tenant tenants.ID, key []byte, room func(valueBytes int) *proto.Response) (_ []byte, _ bool, refused *proto.Response, _ error) {
	if tenant == 0 {
		return nil, false, nil, ErrReservedTenant
	}
	if err := s.reads.take(ctx, tenant, 1); err != nil {
		return nil, false, nil, err
	}
	defer s.reads.give(1)
	dk := dataKey(tenant, key)
	if r := s.refuseRemembered(dk, room); r != nil {
		return nil, false, r, nil
	}
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.dbClosed {
		return nil, false, nil, ErrClosed
	}
	gen := s.lens.generation()
	v, closer, err := s.db.Get(dk)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil, nil
	}
	if err != nil {
		return nil, false, nil, fmt.Errorf("sm: get: %w", err)
	}
	s.lens.record(dk, len(v), gen)
	if room != nil {
		if r := room(len(v)); r != nil {
			closer.Close()
			return nil, false, r, nil
		}
	}
	out := bytes.Clone(v)
	if out == nil {
		out = []byte{}
	}
	closer.Close()
	return out, true, nil, nil
}

// ReadRefusal is what a GET of tenant is answered before anything is
// read, when its value's length is remembered (value_lens.go) and room
// (a ReadResponseWithin room check) refuses an answer of that length;
// nil otherwise, and for any other request: the read goes on. Backends
// ask it before a linearizable read's barrier too, which a refused read
// does not need: a flood of GETs with no room for their answers would
// otherwise keep the consensus loop busy with barriers.
//
// It takes a read slot, in turn with every other read (read_slots.go),
// though it reads nothing: the slots bound how many reads run at once,
// and a flood of refusals that each cost microseconds, unbounded, had
// thousands of goroutines runnable at once, and the consensus loop waited
// behind them for the CPU (a leader's loop stalled 259 ms and lost its
// leadership in an outside tester's flood). nil when ctx ends first.
func (s *SM) ReadRefusal(ctx context.Context, tenant tenants.ID, req *proto.Request, room func(valueBytes int) *proto.Response) *proto.Response {
	if req.Op != proto.OpGet || tenant == 0 || room == nil {
		return nil
	}
	dk := dataKey(tenant, req.Key)
	if _, ok := s.lens.lookup(dk); !ok {
		return nil // nothing to ask: no slot taken
	}
	if err := s.reads.take(ctx, tenant, 1); err != nil {
		return nil
	}
	defer s.reads.give(1)
	return s.refuseRemembered(dk, room)
}

// refuseRemembered asks room (when set) with the remembered length of the
// value under data key dk, if any: its refusal, or nil.
func (s *SM) refuseRemembered(dk []byte, room func(valueBytes int) *proto.Response) *proto.Response {
	if room == nil {
		return nil
	}
	if n, ok := s.lens.lookup(dk); ok {
		return room(n)
	}
	return nil
}

// ValueLen returns the length of tenant's value under key (latest committed
// state) and whether the key is present, without copying the value.
func (s *SM) ValueLen(tenant tenants.ID, key []byte) (int, bool, error) {
	if tenant == 0 {
		return 0, false, ErrReservedTenant
	}
	// It pins the value's block too; no deadline (read_slots.go).
	if err := s.reads.take(context.Background(), tenant, 1); err != nil {
		return 0, false, err
	}
	defer s.reads.give(1)
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.dbClosed {
		return 0, false, ErrClosed
	}
	return storedValueLen(s.db, dataKey(tenant, key))
}

// Scan returns up to limit pairs of tenant with start <= key < end in key
// order; an empty end means the end of the tenant's keyspace. limit is
// clamped to 1..ScanLimitMax. more is true when the scan stopped at the
// limit or at ScanReplyBytesMax of keys and values and more pairs may
// follow; the caller continues from the last key + "\x00".
func (s *SM) Scan(tenant tenants.ID, start, end []byte, limit int) (pairs []proto.KV, more bool, err error) {
	pairs, more, _, err = s.scan(context.Background(), tenant, start, end, limit, nil)
	return pairs, more, err
}

// ScanPairBytes is what one pair adds to a SCAN answer's pair bytes, the
// count a SCAN's room check is called with: its key and value and their
// length prefixes (kv/proto's pair encoding).
func ScanPairBytes(key, value int) int { return 2 + key + 4 + value }

// scan is Scan that waits for its read slots until ctx ends
// (errReadSlotWait) and, with room set, calls room before it copies each
// pair with the answer's pair bytes so far including that pair
// (ScanPairBytes summed): a refusal of a later pair ends the page there
// (more), one of the first pair is returned as refused with no pairs.
// So a SCAN's answer is charged what it holds, pair by pair, rather than
// the largest answer its limit allows: a SCAN of a thousand small pairs
// reserved 3.15 MB up front, and an outside tester's pages of tiny keys
// fell from 1000 pairs to 2 beside a tenant's unread answers.
func (s *SM) scan(ctx context.Context, tenant tenants.ID, start, end []byte, limit int, room func(pairBytes int) *proto.Response) (pairs []proto.KV, more bool, refused *proto.Response, err error) {
	if tenant == 0 {
		return nil, false, nil, ErrReservedTenant
	}
	limit = max(1, min(limit, proto.ScanLimitMax))
	lower := dataKey(tenant, start)
	upper := tenantEnd(tenant)
	if len(end) > 0 {
		upper = dataKey(tenant, end)
	}
	if bytes.Compare(lower, upper) >= 0 {
		return nil, false, nil, nil
	}
	if err := s.reads.take(ctx, tenant, ScanReadSlots); err != nil {
		return nil, false, nil, err
	}
	defer s.reads.give(ScanReadSlots)
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.dbClosed {
		return nil, false, nil, ErrClosed
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, false, nil, fmt.Errorf("sm: scan: %w", err)
	}
	defer it.Close()
	pairBytes := 0 // ScanPairBytes summed: keys, values and their prefixes
	for it.First(); it.Valid(); it.Next() {
		if len(pairs) == limit || pairBytes-len(pairs)*ScanPairBytes(0, 0) >= proto.ScanReplyBytesMax {
			more = true
			break
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, false, nil, fmt.Errorf("sm: scan value: %w", err)
		}
		key := it.Key()[4:]
		if room != nil {
			if r := room(pairBytes + ScanPairBytes(len(key), len(v))); r != nil {
				if len(pairs) == 0 {
					return nil, false, r, nil
				}
				more = true
				break
			}
		}
		pairBytes += ScanPairBytes(len(key), len(v))
		k := bytes.Clone(key)
		if k == nil {
			k = []byte{}
		}
		vc := bytes.Clone(v)
		if vc == nil {
			vc = []byte{}
		}
		pairs = append(pairs, proto.KV{Key: k, Value: vc})
	}
	if err := it.Error(); err != nil {
		return nil, false, nil, fmt.Errorf("sm: scan: %w", err)
	}
	return pairs, more, nil, nil
}

// ReadResponse answers a GET (req.Key) or SCAN (req.Start, req.End,
// req.Limit) of tenant from the applied state: NOT_FOUND for a missing
// key, INTERNAL for a storage error. Any barrier (linearizable reads) and
// any exclusion of a snapshot restore are the caller's. It waits for its
// read slots without a deadline (ReadResponseWithin takes one).
func (s *SM) ReadResponse(tenant tenants.ID, req *proto.Request) *proto.Response {
	return s.ReadResponseWithin(context.Background(), tenant, req, nil)
}

// ReadResponseWithin is ReadResponse that asks room (when not nil)
// whether an answer of so many value or pair bytes can be held before it
// copies them (the server's response budgets: kv/server ValueRoom): a GET
// with the value's length, answering room's refusal instead when not; a
// SCAN before each pair with the pair bytes so far (scan), ending the
// page before the pair refused, or answering the refusal when that is
// the first. It waits for its read slots (read_slots.go) until ctx ends,
// and then answers UNAVAILABLE without having read anything.
func (s *SM) ReadResponseWithin(ctx context.Context, tenant tenants.ID, req *proto.Request, room func(valueBytes int) *proto.Response) *proto.Response {
	if req.Op == proto.OpGet {
		v, ok, refused, err := s.getWithin(ctx, tenant, req.Key, room)
		if err != nil {
			return readErrResponse(err)
		}
		if refused != nil {
			return refused
		}
		if !ok {
			return &proto.Response{Status: proto.StatusNotFound}
		}
		return &proto.Response{Value: v, HasValue: true}
	}
	pairs, more, refused, err := s.scan(ctx, tenant, req.Start, req.End, int(req.Limit), room)
	if err != nil {
		return readErrResponse(err)
	}
	if refused != nil {
		return refused
	}
	return &proto.Response{Pairs: pairs, More: more}
}

// readErrResponse answers a failed read: UNAVAILABLE (retry later) when it
// never got a read slot, INTERNAL (a storage error) otherwise.
func readErrResponse(err error) *proto.Response {
	if errors.Is(err, errReadSlotWait) {
		return proto.Errorf(proto.StatusUnavailable, "%v", err)
	}
	return proto.Errorf(proto.StatusInternal, "%v", err)
}
