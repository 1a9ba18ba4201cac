package sm

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"synod/kv/proto"
	"synod/tenants"
)

// Apply applies the commands of one committed slot, in order, and returns
// one Result per command. Everything the slot changes, plus the new
// applied slot, is committed in one Pebble batch (without sync; see the
// package comment). A slot at or below Applied() was already applied: Apply
// does nothing and returns nil results, which makes log replay after a
// restart idempotent. A slot above Applied()+1 changes nothing and returns
// an error wrapping ErrSlotGap: slots are applied one after another, none
// skipped. A command that does not decode gets BAD_REQUEST (every
// replica decides the same). An error means storage failed; the SM then
// refuses every later Apply, since its state can no longer be trusted to
// match the other replicas'.
func (s *SM) Apply(slot uint64, cmds [][]byte) ([]Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if next, err := s.nextSlot(slot); !next {
		return nil, err
	}
	batch := s.db.NewIndexedBatch()
	defer batch.Close()
	results := make([]Result, len(cmds))
	deltas := map[tenants.ID]usageDelta{}
	w := &slotBatch{batch: batch, db: s.db, lens: &s.alens, written: make(map[string]int, len(cmds))}
	for i, c := range cmds {
		res, err := s.applyOne(w, slot, c, deltas)
		if err != nil {
			s.broken = fmt.Errorf("sm: applying slot %d: %w", slot, err)
			return nil, s.broken
		}
		results[i] = res
	}
	err := s.writeDirty(w)
	var usage []usageUpdate
	if err == nil {
		usage, err = s.commitUsage(batch, deltas)
	}
	if err == nil {
		err = setApplied(batch, slot)
	}
	if err != nil {
		s.broken = fmt.Errorf("sm: applying slot %d: %w", slot, err)
		return nil, s.broken
	}
	if err := batch.Commit(pebble.NoSync); err != nil {
		s.broken = fmt.Errorf("sm: committing slot %d: %w", slot, err)
		return nil, s.broken
	}
	s.lens.applied(w.written)
	s.alens.applied(w.written, w.remember)
	s.installUsage(usage)
	s.garbage.Add(w.garbage)
	s.applied.Store(slot)
	return results, nil
}

// nextSlot says whether slot is the one to apply now (Applied()+1, the SM
// open and sound), and otherwise the error to return: ErrClosed, the
// storage error that broke the SM, nil for a slot already applied, or
// ErrSlotGap. Apply and ApplyMembership call it under s.mu.
func (s *SM) nextSlot(slot uint64) (bool, error) {
	applied := s.applied.Load()
	switch {
	case s.closed:
		return false, ErrClosed
	case s.broken != nil:
		return false, s.broken
	case slot <= applied:
		return false, nil
	case slot != applied+1:
		return false, fmt.Errorf("%w: slot %d, applied %d", ErrSlotGap, slot, applied)
	}
	return true, nil
}

func (s *SM) applyOne(w *slotBatch, slot uint64, cmd []byte, deltas map[tenants.ID]usageDelta) (Result, error) {
	tenant, req, err := DecodeCommand(cmd)
	if err != nil {
		return Result{Status: proto.StatusBadRequest, Message: err.Error()}, nil
	}
	k := clientKey{tenant: tenant, client: req.ClientID}
	if res, done := s.lookup(k, req.Seq); done {
		return res, nil
	}
	d := deltas[tenant]
	res, err := execute(w, tenant, req, &d)
	if err != nil {
		return Result{}, err
	}
	if d != (usageDelta{}) {
		deltas[tenant] = d
	}
	return res, s.record(w, slot, k, req.Seq, req.FirstUnacked, res)
}

// execute performs one decoded write on batch and adds what it changes in
// the tenant's usage to d.
func execute(w *slotBatch, tenant tenants.ID, req *proto.Request, d *usageDelta) (Result, error) {
	batch := w.batch
	switch req.Op {
	case proto.OpPut:
		return Result{}, w.set(dataKey(tenant, req.Key), req.Value, d)
	case proto.OpDelete:
		return Result{}, w.delete(dataKey(tenant, req.Key), d)
	case proto.OpCAS:
		dk := dataKey(tenant, req.Key)
		cur, ok, err := batchGet(batch, dk)
		if err != nil {
			return Result{}, err
		}
		if !casMatches(cur, ok, req.ExpectPresent, req.ExpectDigest, req.Expect) {
			return Result{Status: proto.StatusCASMismatch, Value: cur, HasValue: ok}, nil
		}
		return Result{}, w.set(dk, req.Value, d)
	case proto.OpBatch:
		// Conditions first, against the state before the batch; then every
		// write. Nothing is written unless every condition holds.
		for i := range req.Ops {
			op := &req.Ops[i]
			if op.Op != proto.OpCAS {
				continue
			}
			cur, ok, err := batchGet(batch, dataKey(tenant, op.Key))
			if err != nil {
				return Result{}, err
			}
			if !casMatches(cur, ok, op.ExpectPresent, op.ExpectDigest, op.Expect) {
				return Result{Status: proto.StatusCASMismatch, FailedOp: uint32(i),
					Message: fmt.Sprintf("batch op %d: compare failed", i)}, nil
			}
		}
		for i := range req.Ops {
			op := &req.Ops[i]
			var err error
			if op.Op == proto.OpDelete {
				err = w.delete(dataKey(tenant, op.Key), d)
			} else {
				err = w.set(dataKey(tenant, op.Key), op.Value, d)
			}
			if err != nil {
				return Result{}, err
			}
		}
		return Result{}, nil
	}
	return Result{Status: proto.StatusBadRequest, Message: fmt.Sprintf("%v is not a write", req.Op)}, nil
}

// casMatches reports whether a CAS condition holds for the key's current
// value cur (present: the key exists): absent, exactly expect, or (digest)
// a value whose SHA-256 is expect.
func casMatches(cur []byte, present, expectPresent, digest bool, expect []byte) bool {
	switch {
	case !expectPresent:
		return !present
	case digest:
		return present && bytes.Equal(proto.ValueDigest(cur), expect)
	}
	return present && bytes.Equal(cur, expect)
}

func batchGet(batch *pebble.Batch, key []byte) ([]byte, bool, error) {
	v, closer, err := batch.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading %x: %w", key, err)
	}
	out := bytes.Clone(v)
	if out == nil {
		out = []byte{}
	}
	closer.Close()
	return out, true, nil
}
