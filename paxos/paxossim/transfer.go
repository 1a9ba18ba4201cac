package paxossim

import (
	"errors"
	"slices"

	"synod/paxos"
)

// Snapshot transfers. The core deals only in snapshot metadata: a lagging
// node's Ready carries a SnapshotOffer, and the application moves the
// state. The simulated application does what the replica runtime does,
// with the timing and failures a seed chooses:
//
//  1. offer: it starts a transfer from the offering node (up to
//     xfersPerNodeMax at once: a runtime may retry while an old transfer is
//     still on the wire), which serves either its state as applied now,
//     stamped with SnapshotMetaAt (the runtime's fresh Pebble snapshot), or
//     its retained snapshot of the last compaction; the state is captured
//     when the transfer starts;
//  2. the transfer takes 1..xferTicksMax ticks, and fails when the link
//     breaks (a seed-chosen rate), when the server crashed meanwhile, or
//     when the fetching node crashed (a transfer is volatile);
//  3. complete: the state is staged durably (durableStore.staged), a seed
//     may crash the node right there, and otherwise InstallSnapshot is
//     called; ErrSnapshotStale (a transfer that arrived late, or was
//     overtaken by another) discards the staged copy; an accepted install
//     is swapped in when its Ready names it (installSnapshot);
//  4. restart: a complete staged copy above the durable application state
//     is swapped in before the node starts (the runtime's sm.Open does the
//     same), otherwise removed.
const (
	xfersPerNodeMax   = 2
	xferTicksMax      = 40
	xferFailPPM       = 150_000 // a transfer's link breaks
	xferRetainedPPM   = 400_000 // the server serves its retained compaction snapshot rather than its current state
	xferSecondPPM     = 300_000 // an offer starts another transfer while one is in flight
	stagedCrashPPM    = 80_000  // the node crashes after staging, before InstallSnapshot
	xferLateTicksOdds = 4       // one transfer in this many takes up to 4*xferTicksMax
)

// transfer is a snapshot transfer in flight to one node (volatile).
type transfer struct {
	from      paxos.NodeID
	serverInc int // the server's incarnation when it began serving
	meta      paxos.SnapshotMeta
	data      []byte
	doneAt    int64 // tick
	broken    bool
}

// stagedSnap is a complete, verified staged copy (durable).
type stagedSnap struct {
	meta paxos.SnapshotMeta
	data []byte
}

// offered starts a transfer for an offer sn's Ready carried (after its
// Advance: InstallSnapshot is an input, never between Ready and Advance).
func (s *sim) offered(sn *simNode, offer *paxos.SnapshotOffer) {
	if len(sn.xfers) >= xfersPerNodeMax || (len(sn.xfers) > 0 && !s.r.ppm(xferSecondPPM)) {
		return
	}
	srv := s.byID[offer.From]
	tick := s.now / microsPerTick
	if srv == nil || !srv.up() {
		return // the dial fails; the offer comes again
	}
	t := &transfer{from: srv.id, serverInc: srv.incarnation}
	if s.r.ppm(xferRetainedPPM) && srv.store.snapMeta != nil {
		t.meta = cloneMeta(*srv.store.snapMeta)
		t.data = slices.Clone(srv.store.snapData)
	} else {
		meta, err := srv.n.SnapshotMetaAt(srv.app.applied)
		if err != nil {
			s.tracef("node %d: cannot serve node %d its state at %d: %v", srv.id, sn.id, srv.app.applied, err)
			s.result.Counts.TransfersFailed++
			return
		}
		t.meta = meta
		t.data = srv.app.encode()
	}
	d := s.r.between(1, xferTicksMax)
	if s.r.chance(1, xferLateTicksOdds) {
		d = s.r.between(xferTicksMax, 4*xferTicksMax)
	}
	t.doneAt = tick + d
	t.broken = s.faults != 0 && !s.liveness && s.r.ppm(xferFailPPM)
	sn.xfers = append(sn.xfers, t)
	s.result.Counts.TransfersStarted++
	s.tracef("node %d: fetch snapshot at %d from node %d (offered %d), done at tick %d", sn.id, t.meta.Slot, srv.id, offer.Meta.Slot, t.doneAt)
}

// transferStep completes the transfers due at tick.
func (s *sim) transferStep(tick int64) {
	for _, sn := range s.nodes {
		for i := 0; sn.up() && i < len(sn.xfers); {
			t := sn.xfers[i]
			if t.doneAt > tick {
				i++
				continue
			}
			sn.xfers = slices.Delete(sn.xfers, i, i+1)
			srv := s.byID[t.from]
			if t.broken || !srv.up() || srv.incarnation != t.serverInc {
				s.tracef("node %d: snapshot transfer from node %d failed", sn.id, t.from)
				s.result.Counts.TransfersFailed++
				continue
			}
			s.completeTransfer(sn, t)
		}
	}
}

// completeTransfer stages t's state durably and asks the node to install
// it.
func (s *sim) completeTransfer(sn *simNode, t *transfer) {
	sn.store.staged = &stagedSnap{meta: cloneMeta(t.meta), data: t.data}
	if !s.liveness && s.faults.Has(FaultCrash) && s.r.ppm(stagedCrashPPM) {
		s.tracef("node %d: crash between staging snapshot %d and installing it", sn.id, t.meta.Slot)
		s.result.Counts.StagedCrashes++
		s.crash(sn, s.r.between(downTicksMin, downTicksMax))
		return
	}
	err := sn.n.InstallSnapshot(t.meta)
	switch {
	case errors.Is(err, paxos.ErrSnapshotStale):
		s.tracef("node %d: snapshot %d arrived late (commit %d): discarded", sn.id, t.meta.Slot, sn.n.Status().Commit)
		s.result.Counts.TransfersStale++
		sn.store.staged = nil
	case err != nil:
		s.chk.violate("node %d: InstallSnapshot(%+v) of a state node %d served: %v", sn.id, t.meta, t.from, err)
		sn.store.staged = nil
	default:
		s.process(sn) // its Ready names the snapshot: installSnapshot swaps it in
	}
}

// recoverStaged is the restart rule for a complete staged copy: swapped in
// when above the durable application state (app), removed otherwise. It
// returns the application to start from.
func (s *sim) recoverStaged(sn *simNode, app *kvApp) *kvApp {
	st := sn.store.staged
	if st == nil {
		return app
	}
	sn.store.staged = nil
	if st.meta.Slot <= app.applied {
		return app
	}
	staged, err := decodeKVApp(st.data)
	if err != nil {
		s.chk.violate("node %d: staged snapshot at %d unreadable: %v", sn.id, st.meta.Slot, err)
		return app
	}
	s.tracef("node %d: restart finishes installing staged snapshot %d", sn.id, st.meta.Slot)
	sn.store.saveSnapshot(st.meta, st.data)
	sn.store.truncate(st.meta.Slot)
	if s.appDurableEveryApply {
		sn.store.appState = slices.Clone(st.data)
	}
	s.chk.state(sn.id, st.meta.Slot, staged.hash())
	return staged
}

// cloneMeta deep-copies m (through the codec, so every field it carries
// is copied).
func cloneMeta(m paxos.SnapshotMeta) paxos.SnapshotMeta {
	c, err := paxos.UnmarshalSnapshotMeta(paxos.AppendSnapshotMeta(nil, &m))
	if err != nil {
		panic(err)
	}
	return c
}
