package replica

import (
	"fmt"
	"time"

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
	defer close(r.applyExited)
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
		case <-r.apply.flushing: // nil while no compaction flush runs
			r.flushed()
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
	// flushing is closed when the compaction flush of flushSlot completed
	// (nil while none runs; snapshot_compact.go).
	flushing  <-chan struct{}
	flushSlot uint64
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
		as.every = r.snapshotEvery()
		as.lastSnap = r.sm.Applied()
		as.cmds = make([][]byte, 0, proposeBatchCmdsMax)
		as.mine = make([]applyOrigin, 0, proposeBatchCmdsMax)
	}
	return as
}

// snapshotEvery is how many applied slots pass between snapshots: the
// config's SnapshotEverySlots, or snapshotEverySlots.
func (r *Replica) snapshotEvery() uint64 {
	if r.cfg.SnapshotEverySlots > 0 {
		return r.cfg.SnapshotEverySlots
	}
	return snapshotEverySlots
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
	if it.install != nil {
		r.installStaged(*it.install)
		return
	}
	r.applyDelay() // faults_delay.go: drills only
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
		start := r.stageNow()
		if it.queued != 0 {
			r.writeStageTook(wsApplyQueue, r.since(it.queued, start), e.Slot)
		}
		var results []sm.Result
		var err error
		if e.Type == paxos.EntryConfChange {
			err = r.applyConfChange(&e) // the membership record (members.go)
		} else {
			results, err = r.sm.Apply(uint64(e.Slot), cmds)
		}
		done := r.stageNow()
		r.writeStageTook(wsApply, r.since(start, done), e.Slot)
		if err != nil {
			as.broken = true
			r.die(fmt.Errorf("applying slot %d: %w", e.Slot, err))
			break
		}
		if !testingAnswerBeforeApplied {
			r.applied.Store(uint64(e.Slot)) // before the answers (Replica.applied)
		}
		for _, m := range mine {
			var res sm.Result
			if m.idx < len(results) {
				res = results[m.idx]
			}
			r.answer(m.id, m.env, writeResult{res: res, answered: done, slot: e.Slot})
		}
		if testingAnswerBeforeApplied {
			time.Sleep(20 * time.Millisecond)
			r.applied.Store(uint64(e.Slot))
		}
	}
	applied := r.sm.Applied()
	r.metrics.Applied.Set(float64(applied))
	r.reads.release(paxos.Slot(applied))
	if !as.broken && applied >= as.lastSnap+as.every {
		r.snapshot(&as.lastSnap)
	}
}
