package replica

import (
	"bytes"
	"fmt"
	"io"

	"synod/kv/sm"
	"synod/paxos"
)

// applyLoop applies snapshots and committed entries in order, answers the
// writers waiting on this node, wakes reads, and takes periodic snapshots.
// It runs until applyC is closed (after the consensus loop stopped), so what
// was committed and queued is applied before Close returns. The loop only
// receives; applyInput and snapshotNow do the work, so that the
// deterministic simulator can drive the same code.
func (r *Replica) applyLoop() {
	defer r.applyWG.Done()
	if err := pinCPU(r.cfg.Cores.Apply); err != nil {
		r.reportFatal(err)
		return
	}
	for {
		select {
		case it, ok := <-r.applyC:
			if !ok {
				return
			}
			r.applyInput(it)
		case <-r.snapNow:
			r.snapshotNow()
		}
	}
}

// applyState is the apply loop's own bookkeeping (apply loop only).
type applyState struct {
	started  bool
	lastSnap uint64
	every    uint64
	cmds     [][]byte
	mine     []applyOrigin
	broken   bool // the state machine failed: apply nothing more
}

// applyOrigin is a command of this node's: which result answers which
// writer.
type applyOrigin struct {
	idx int
	id  uint64
	env []byte
}

func (r *Replica) applyInit() *applyState {
	as := &r.apply
	if !as.started {
		as.started = true
		as.every = r.cfg.SnapshotEverySlots
		if as.every == 0 {
			as.every = snapshotEverySlots
		}
		as.lastSnap = r.sm.Applied()
		as.cmds = make([][]byte, 0, proposeBatchCmdsMax)
		as.mine = make([]applyOrigin, 0, proposeBatchCmdsMax)
	}
	return as
}

// snapshotNow takes a snapshot on request (apply loop).
func (r *Replica) snapshotNow() {
	as := r.applyInit()
	if !as.broken {
		r.snapshot(&as.lastSnap)
	}
}

// applyInput installs a snapshot or applies committed entries (apply loop).
func (r *Replica) applyInput(it applyItem) {
	as := r.applyInit()
	if as.broken {
		return
	}
	if it.snap != nil {
		if uint64(it.snap.Meta.Slot) <= r.sm.Applied() {
			return // already past it
		}
		r.restoreMu.Lock()
		err := r.sm.Restore(bytes.NewReader(it.snap.Data))
		r.restoreMu.Unlock()
		if err != nil {
			as.broken = true
			r.die(fmt.Errorf("restoring snapshot at slot %d: %w", it.snap.Meta.Slot, err))
			return
		}
		applied := r.sm.Applied()
		r.metrics.Installed.Inc()
		r.metrics.SnapshotSlot.Set(float64(applied))
		r.metrics.SnapshotBytes.Set(float64(len(it.snap.Data)))
		r.log.Info().Uint64("slot", applied).Int("bytes", len(it.snap.Data)).Msg("installed snapshot")
		r.applied.Store(applied)
		as.lastSnap = applied
		r.reads.release(paxos.Slot(applied))
		return
	}
	for _, e := range it.entries {
		if uint64(e.Slot) <= r.sm.Applied() {
			continue // applied before a restart or covered by a snapshot
		}
		cmds, mine := as.cmds[:0], as.mine[:0]
		if e.Type == paxos.EntryNormal {
			for _, c := range e.Cmds {
				id, cmd, err := parseEnvelope(c)
				if err != nil {
					// Every replica skips the same bytes: still deterministic.
					r.log.Warn().Uint64("slot", uint64(e.Slot)).Msg("skipping a command with a malformed envelope")
					continue
				}
				if id.origin == r.cfg.ID && id.boot == r.boot {
					mine = append(mine, applyOrigin{idx: len(cmds), id: id.seq, env: c})
				}
				cmds = append(cmds, cmd)
			}
		}
		start := r.cfg.Now()
		results, err := r.sm.Apply(uint64(e.Slot), cmds)
		r.metrics.applySeconds.Observe(r.cfg.Now().Sub(start).Seconds())
		if err != nil {
			as.broken = true
			r.die(fmt.Errorf("applying slot %d: %w", e.Slot, err))
			break
		}
		for _, m := range mine {
			var res sm.Result
			if m.idx < len(results) {
				res = results[m.idx]
			}
			r.answer(m.id, m.env, writeResult{res: res})
		}
		r.applied.Store(uint64(e.Slot))
	}
	applied := r.sm.Applied()
	r.metrics.Applied.Set(float64(applied))
	r.reads.release(paxos.Slot(applied))
	if !as.broken && applied >= as.lastSnap+as.every {
		r.snapshot(&as.lastSnap)
	}
}

// snapshot flushes the state machine, takes a snapshot and hands it to the
// consensus loop, which compacts paxos and truncates the acceptor log below
// the flushed slot (never beyond what is durable in Pebble).
func (r *Replica) snapshot(last *uint64) {
	durable, err := r.sm.Flush()
	if err != nil {
		r.log.Warn().Err(err).Msg("flush before snapshot failed")
		return
	}
	rc, slot, err := r.sm.Snapshot()
	if err != nil {
		r.log.Warn().Err(err).Msg("snapshot failed")
		return
	}
	data, err := io.ReadAll(io.LimitReader(rc, paxos.SnapshotBytesMax+1))
	rc.Close()
	if err != nil {
		r.log.Warn().Err(err).Msg("reading snapshot failed")
		return
	}
	*last = slot
	if len(data) > paxos.SnapshotBytesMax {
		// A truncated snapshot must never be handed out. Without
		// compaction the log keeps growing until it is full, which is
		// backpressure, not loss. (Streaming larger snapshots is not
		// implemented.)
		r.log.Error().Uint64("slot", slot).Int("limit", paxos.SnapshotBytesMax).
			Msg("snapshot exceeds paxos.SnapshotBytesMax: not compacting")
		return
	}
	r.metrics.Snapshots.Inc()
	r.metrics.SnapshotSlot.Set(float64(slot))
	r.metrics.SnapshotBytes.Set(float64(len(data)))
	r.log.Debug().Uint64("slot", slot).Uint64("durable", durable).Int("bytes", len(data)).Msg("snapshot taken")
	// Never block here: the consensus loop may itself be blocked handing
	// this loop committed entries. A full control queue only delays
	// compaction to the next snapshot.
	select {
	case r.controlC <- func() { r.compacted(paxos.Slot(slot), paxos.Slot(durable), data) }:
	default:
		r.log.Warn().Uint64("slot", slot).Msg("control queue full; compaction deferred to the next snapshot")
	}
}
