package replica

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"synod/kv/sm"
	"synod/paxos"
)

// The fetching side of snapshot transfers (snapshot_wire.go). A Ready's
// SnapshotOffer reaches the fetcher (offerSnapshot; the newest offer
// waits, older ones are dropped: offers repeat while the node lags). The
// fetcher runs one transfer at a time (snapshotFetchesMax):
//
//  1. it stages the stream chunk by chunk (sm.BeginStage: a fresh
//     directory beside the live state, nothing held whole in memory),
//     checking every frame's transfer id and sequence and giving up when
//     the node's commit index passes the snapshot's slot meanwhile (the
//     transfer is superseded: the node caught up otherwise);
//  2. Finish verifies the stream and makes the staged copy complete and
//     durable;
//  3. the consensus loop calls InstallSnapshot: ErrSnapshotStale (the node
//     moved past it while it was finishing) discards the staged copy;
//     otherwise its Ready has the apply loop swap it in (installStaged),
//     and the fetcher waits for that before it stages anything else.
//
// A transfer that fails (the server died: a leader killed mid-transfer,
// a stall past snapshotStallTimeout, a bad frame, a refusal) is
// aborted and its partial staging removed; the node is offered again while
// it lags, by the next leader if need be. A crash at any point leaves
// either a partial staging, which the state machine removes when it
// opens, or a complete one, which it swaps in when it is above the
// applied state (kv/sm: "Staged restores").

// snapFetch is one inbound transfer. Its methods are for one goroutine.
type snapFetch struct {
	r      *Replica
	from   paxos.NodeID
	id     uint64
	st     *sm.Stager
	digest []byte // a delta request's (nil: a whole stream)
	kept   int    // ranges the server kept (a delta, once staged)
	ranges int
	// Phase durations for the log: the digest (a delta's checkpoint and
	// hashing), until the header, until the end frame, Finish.
	digestTook, headerAt, endAt, finishTook time.Duration
	meta                                    paxos.SnapshotMeta
	header                                  bool
	seq                                     uint64
	got                                     uint64
	done                                    bool
	start                                   time.Time
}

// offerSnapshot hands a Ready's offer to the fetcher without blocking
// (consensus loop): the newest offer replaces one still waiting.
func (r *Replica) offerSnapshot(o paxos.SnapshotOffer) {
	for range 2 {
		select {
		case r.snapOffers <- o:
			return
		default:
		}
		select {
		case old := <-r.snapOffers:
			if old.Meta.Slot > o.Meta.Slot {
				o = old
			}
		default:
		}
	}
}

// fetchBegin starts a transfer for offer: it opens the staging. With
// Config.DeltaSnapshots a node that holds state asks for a delta (kv/sm
// "Delta snapshots": its staging starts as a checkpoint of its state,
// whose digest goes with the request), unless its last delta request
// failed before the server answered (a server of an earlier version
// refuses the frame).
func (r *Replica) fetchBegin(offer paxos.SnapshotOffer) (*snapFetch, error) {
	delta := r.cfg.DeltaSnapshots && r.sm.Applied() > 0 && !r.snapWholeNext.Swap(false)
	var st *sm.Stager
	var digest []byte
	var err error
	start := r.cfg.Now()
	if delta {
		st, err = r.sm.BeginDeltaStage()
		if err == nil {
			// Hashing a large state takes a while: Close does not wait.
			select {
			case <-st.DigestReady():
				digest, err = st.Digest()
			case <-r.stop:
				err = ErrStopped
			}
			if err != nil {
				st.Abort()
			}
		}
	} else {
		st, err = r.sm.BeginStage()
	}
	if err != nil {
		return nil, err
	}
	var b [8]byte
	rand.Read(b[:])
	f := &snapFetch{r: r, from: offer.From, id: binary.LittleEndian.Uint64(b[:]) | 1, st: st, digest: digest, start: start}
	f.digestTook = r.cfg.Now().Sub(start)
	r.metrics.Snap.InFlight.WithLabelValues(dirReceived).Inc()
	return f, nil
}

// request is the request frame's payload.
func (f *snapFetch) request() []byte {
	if f.digest != nil {
		return appendSnapDeltaRequest(nil, f.id, f.r.cfg.ID, f.from, uint64(f.r.Status().Commit), f.digest)
	}
	return appendSnapRequest(nil, f.id, f.r.cfg.ID, f.from, uint64(f.r.Status().Commit))
}

// onFrame takes one frame from the server; done once the end frame arrived
// and the staged copy is complete (f.meta names it).
func (f *snapFetch) onFrame(b []byte) (done bool, err error) {
	r := f.r
	fr, err := decodeSnapFrame(b)
	if err != nil {
		return false, err
	}
	if fr.id != f.id {
		return false, fmt.Errorf("%w: transfer id %#x, want %#x", errSnapFrame, fr.id, f.id)
	}
	switch fr.kind {
	case snapFrameHeader:
		if f.header {
			return false, fmt.Errorf("%w: a second header", errSnapFrame)
		}
		f.header, f.meta = true, fr.meta
		f.headerAt = r.cfg.Now().Sub(f.start)
		return false, f.stale()
	case snapFrameChunk:
		if !f.header || fr.seq != f.seq+1 {
			return false, fmt.Errorf("%w: chunk %d after %d (header %v)", errSnapFrame, fr.seq, f.seq, f.header)
		}
		if err := r.stagingRoom(f.got); err != nil {
			return false, err
		}
		if _, err := f.st.Write(fr.data); err != nil {
			return false, fmt.Errorf("staging chunk %d: %w", fr.seq, err)
		}
		f.seq++
		f.got += uint64(len(fr.data))
		r.metrics.Snap.ReceivedBytes.Add(float64(len(fr.data)))
		if TestingSnapshotChunkHook != nil {
			TestingSnapshotChunkHook(r.cfg.ID, f.seq)
		}
		return false, f.stale()
	case snapFrameEnd:
		if !f.header || fr.seq != f.seq || fr.bytes != f.got {
			return false, fmt.Errorf("%w: end after %d chunks and %d bytes, received %d and %d", errSnapFrame, fr.seq, fr.bytes, f.seq, f.got)
		}
		f.endAt = r.cfg.Now().Sub(f.start)
		slot, err := f.st.Finish()
		f.finishTook = r.cfg.Now().Sub(f.start) - f.endAt
		f.kept, f.ranges = f.st.DeltaRanges()
		f.st = nil
		if err != nil {
			return false, fmt.Errorf("finishing the staged snapshot: %w", err)
		}
		if slot != uint64(f.meta.Slot) {
			r.sm.DiscardStaged()
			return false, fmt.Errorf("%w: the stream is at slot %d, its header says %d", errSnapFrame, slot, f.meta.Slot)
		}
		f.done = true
		if TestingSnapshotChunkHook != nil {
			TestingSnapshotChunkHook(r.cfg.ID, snapHookStaged)
		}
		return true, nil
	case snapFrameRefuse:
		return false, fmt.Errorf("%w (reason %d)", errSnapRefused, fr.reason)
	}
	return false, fmt.Errorf("%w: kind %d from the server", errSnapFrame, fr.kind)
}

// stale reports errSnapStale once the node's commit index reached the
// snapshot's slot: it caught up otherwise, the transfer is superseded.
func (f *snapFetch) stale() error {
	if c := f.r.Status().Commit; f.header && c >= f.meta.Slot {
		return fmt.Errorf("%w: commit %d reached the snapshot's slot %d", errSnapStale, c, f.meta.Slot)
	}
	return nil
}

// end records the transfer's outcome; an unfinished staging is aborted.
func (f *snapFetch) end(err error) {
	r := f.r
	if f.st != nil {
		f.st.Abort()
		f.st = nil
	}
	m := &r.metrics.Snap
	m.InFlight.WithLabelValues(dirReceived).Dec()
	took := r.cfg.Now().Sub(f.start)
	m.Seconds.WithLabelValues(dirReceived).Observe(took.Seconds())
	result := resultOK
	switch {
	case errors.Is(err, errSnapStale) || errors.Is(err, paxos.ErrSnapshotStale):
		result = resultStale
	case errors.Is(err, errSnapRefused):
		result = resultRefused
	case errors.Is(err, errSnapNoSpace):
		result = resultNoSpace
	case err != nil:
		result = resultFailed
	}
	if f.done && f.digest != nil {
		m.DeltaRanges.WithLabelValues(rangesKept).Add(float64(f.kept))
		m.DeltaRanges.WithLabelValues(rangesReplaced).Add(float64(f.ranges - f.kept))
	}
	// Last of the counters: a reader that sees the transfer counted sees
	// its ranges too (TestDeltaCatchUpSendsWhatChanged waits on it).
	m.Transfers.WithLabelValues(dirReceived, result).Inc()
	if f.digest != nil && !f.header && result == resultFailed {
		// No answer to a delta request: perhaps a server that does not
		// know the frame. The next transfer asks for a whole stream.
		r.snapWholeNext.Store(true)
	}
	ev := r.log.Info()
	if err != nil && result == resultFailed {
		ev = r.log.Warn().Err(err)
	} else if err != nil {
		ev = ev.Err(err)
	}
	if f.digest != nil {
		ev = ev.Bool("delta", true).Int("ranges", f.ranges).Int("kept", f.kept).Dur("digest", f.digestTook)
	}
	ev = ev.Dur("header_at", f.headerAt).Dur("end_at", f.endAt).Dur("finish", f.finishTook)
	ev.Uint64("from", uint64(f.from)).Uint64("slot", uint64(f.meta.Slot)).Uint64("bytes", f.got).Dur("took", took).
		Str("result", result).Msg("snapshot transfer")
}

// snapInstall hands a complete staged copy to paxos (InstallSnapshot, on
// the consensus loop) and waits for the apply loop's swap. Its methods
// never block, so the simulator can drive it; fetchLoop waits on its
// channels.
type snapInstall struct {
	meta    paxos.SnapshotMeta
	verdict chan error // cap 1: the consensus loop's
	asked   bool
}

// errInstallLater: the consensus loop is between a Ready and its Advance
// (stalled on a full log), when paxos takes no input; ask again.
var errInstallLater = errors.New("replica: install deferred")

// ask queues the InstallSnapshot call; false when the control queue is
// full (ask again later).
func (r *Replica) installAsk(in *snapInstall) bool {
	if in.verdict == nil {
		in.verdict = make(chan error, 1)
	}
	meta, verdict := in.meta, in.verdict
	select {
	case r.controlC <- func() {
		if r.stalled != nil {
			verdict <- errInstallLater
			return
		}
		verdict <- r.node.InstallSnapshot(meta)
	}:
		in.asked = true
		return true
	default:
		return false
	}
}

// installStaged swaps in the staged copy an accepted install names (apply
// loop), and tells the fetcher.
func (r *Replica) installStaged(meta paxos.SnapshotMeta) {
	as := &r.apply
	slot := uint64(meta.Slot)
	var err error
	if slot <= r.sm.Applied() {
		// Already past it (the accel early path applied further).
		err = r.sm.DiscardStaged()
		if err == nil {
			err = errSnapStale
		}
	} else {
		start := r.cfg.Now()
		r.restoreMu.Lock()
		err = r.sm.InstallStaged(slot)
		r.restoreMu.Unlock()
		if err != nil {
			as.broken = true
			r.die(fmt.Errorf("installing the staged snapshot at slot %d: %w", slot, err))
		} else {
			r.metrics.Installed.Inc()
			r.metrics.SnapshotSlot.Set(float64(slot))
			r.log.Info().Uint64("slot", slot).Dur("swap", r.cfg.Now().Sub(start)).Msg("installed snapshot")
			r.applied.Store(slot)
			as.lastSnap = slot
			r.reads.release(meta.Slot)
			r.membershipInstalled() // the snapshot's membership record (members.go)
		}
	}
	select {
	case r.snapSwapped <- err:
	default:
	}
}

// fetchLoop runs the node's transfers, one at a time (snapshotFetchesMax).
func (r *Replica) fetchLoop() {
	defer r.loopsWG.Done()
	for {
		select {
		case <-r.stop:
			return
		case o := <-r.snapOffers:
			if r.Status().Commit >= o.Meta.Slot {
				continue // caught up meanwhile
			}
			r.fetchOnce(o)
		}
	}
}

// fetchOnce runs one transfer to its end: staged and installed, or failed.
func (r *Replica) fetchOnce(o paxos.SnapshotOffer) {
	peer, ok := r.peer(o.From)
	if !ok || o.From == r.cfg.ID {
		return
	}
	if err := r.stagingRoom(0); err != nil {
		r.log.Warn().Err(err).Dur("retry_in", snapshotNoSpaceBackoff).Msg("cannot stage a snapshot")
		r.metrics.Snap.Transfers.WithLabelValues(dirReceived, resultNoSpace).Inc()
		r.waitOrStop(snapshotNoSpaceBackoff)
		return
	}
	f, err := r.fetchBegin(o)
	if err != nil {
		r.log.Warn().Err(err).Msg("cannot stage a snapshot")
		return
	}
	err = r.fetchStream(f, peer.ConsensusAddr.String())
	if err == nil {
		err = r.fetchInstall(f)
	}
	f.end(err)
	if errors.Is(err, errSnapNoSpace) {
		r.log.Warn().Dur("retry_in", snapshotNoSpaceBackoff).Msg("snapshot staging stopped at the disk reserve; its partial copy is removed")
		r.waitOrStop(snapshotNoSpaceBackoff)
	}
}

// fetchStream runs the connection: request, then frames until the end.
func (r *Replica) fetchStream(f *snapFetch, addr string) error {
	c, err := net.DialTimeout("tcp", addr, sideDialTimeout)
	if err != nil {
		return err
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-r.stop:
			c.Close()
		case <-done:
		}
	}()
	defer c.Close()
	var magic [4]byte
	binary.LittleEndian.PutUint32(magic[:], snapshotConnMagic)
	c.SetWriteDeadline(time.Now().Add(snapshotStallTimeout))
	if _, err := c.Write(magic[:]); err != nil {
		return err
	}
	sc := newSnapConn(c, nil, r.cfg.Auth)
	if err := sc.write(f.request()); err != nil {
		return err
	}
	for {
		b, err := sc.read()
		if err != nil {
			return err
		}
		if r.cfg.Auth != nil && sc.peer != f.from {
			return fmt.Errorf("%w: frame sealed by node %d, fetching from %d", errSnapFrame, sc.peer, f.from)
		}
		done, err := f.onFrame(b)
		if err != nil || done {
			return err
		}
	}
}

// fetchInstall hands the staged copy to paxos and waits for the swap.
func (r *Replica) fetchInstall(f *snapFetch) error {
	in := &snapInstall{meta: f.meta}
	for {
		if !r.installAsk(in) {
			if !r.waitOrStop(snapshotInstallRetry) {
				return ErrStopped
			}
			continue
		}
		var err error
		select {
		case <-r.stop:
			return ErrStopped
		case err = <-in.verdict:
		}
		if errors.Is(err, errInstallLater) {
			if !r.waitOrStop(snapshotInstallRetry) {
				return ErrStopped
			}
			continue
		}
		if err != nil {
			r.sm.DiscardStaged()
			return err
		}
		select {
		case <-r.stop:
			return ErrStopped // Close applies what is queued: the swap is done or the restart finishes it
		case err = <-r.snapSwapped:
			return err
		}
	}
}

// TestingSnapshotChunkHook, when set (tests only), runs after a fetcher
// staged chunk seq, and with snapHookStaged once the staged copy is
// complete (before paxos hears of it): a test crashes the node there.
var TestingSnapshotChunkHook func(node paxos.NodeID, seq uint64)

// snapHookStaged is TestingSnapshotChunkHook's seq for a complete staging.
const snapHookStaged = ^uint64(0)
