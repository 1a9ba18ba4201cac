package replica

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"synod/kv/sm"
	"synod/paxos"
)

// The serving side of snapshot transfers (snapshot_wire.go). The server
// streams a fresh Pebble snapshot of its state as applied when the request
// arrives, not the snapshot of its last compaction: taking one is O(1),
// nothing is held while no transfer runs (a held Pebble snapshot pins old
// data), it serves at once after a restart, and it brings the fetcher as
// close to the head of the log as possible, which is what lets a catch-up
// converge when a transfer takes longer than the interval between
// compactions. Paxos stamps it with the metadata for its slot
// (SnapshotMetaAt: the membership in force after it), on the consensus
// loop, and pins the log above that slot (compaction keeps it, within
// snapshotRetainLogPercentMax of the acceptor log) until the transfer ends
// and snapshotRetainAfter has passed, so the fetcher catches up from the
// log after installing.

// snapServe is one outbound transfer. Its methods are for one goroutine
// (the connection's, or the simulator's).
type snapServe struct {
	r     *Replica
	to    paxos.NodeID
	id    uint64 // the fetcher's transfer id
	rc    io.ReadCloser
	slot  uint64
	metaC chan snapMetaResult // cap 1: the consensus loop's stamp
	meta  paxos.SnapshotMeta
	// state: stamped once the metadata arrived, headed once the header
	// frame was produced, ended once the end frame was.
	stamped, headed, ended bool
	pin                    uint64
	// delta: a delta stream (snapshot_wire.go), handed on as it comes
	// (the server may hash kept ranges for a while between bytes).
	delta     bool
	seq, sent uint64
	buf, out  []byte
	start     time.Time
	closed    bool
}

type snapMetaResult struct {
	meta paxos.SnapshotMeta
	pin  uint64
	err  error
}

// errSnapBusy refuses a transfer: the server runs snapshotServesMax
// already, or its control queue is full.
var errSnapBusy = errors.New("replica: snapshot transfers busy")

// serveBegin admits a transfer of this node's state to node to: it takes a
// Pebble snapshot (O(1)) and asks the consensus loop to stamp it. With a
// digest (a delta request) the stream is a delta against it. It never
// blocks.
func (r *Replica) serveBegin(to paxos.NodeID, id uint64, digest []byte) (*snapServe, error) {
	select {
	case r.snapServes <- struct{}{}:
	default:
		return nil, errSnapBusy
	}
	var rc io.ReadCloser
	var slot uint64
	var err error
	if digest != nil {
		rc, slot, err = r.sm.SnapshotDelta(digest)
	} else {
		rc, slot, err = r.sm.Snapshot()
	}
	if err != nil {
		<-r.snapServes
		return nil, err
	}
	sv := &snapServe{r: r, to: to, id: id, rc: rc, slot: slot, delta: digest != nil, metaC: make(chan snapMetaResult, 1), start: r.cfg.Now()}
	select {
	case r.controlC <- func() { r.stampSnapshot(sv.slot, sv.metaC) }:
	default:
		rc.Close()
		<-r.snapServes
		return nil, errSnapBusy
	}
	r.metrics.Snap.InFlight.WithLabelValues(dirSent).Inc()
	return sv, nil
}

// stampSnapshot runs on the consensus loop: paxos's metadata for a state
// served at slot, and a pin that keeps the log above it.
func (r *Replica) stampSnapshot(slot uint64, c chan<- snapMetaResult) {
	meta, err := r.node.SnapshotMetaAt(paxos.Slot(slot))
	var pin uint64
	if err == nil {
		pin = r.pins.hold(paxos.Slot(slot), r.cfg.Now())
	}
	c <- snapMetaResult{meta: meta, pin: pin, err: err}
}

// stamp takes the consensus loop's answer.
func (sv *snapServe) stamp(res snapMetaResult) error {
	sv.stamped = true
	sv.pin = res.pin
	if res.err != nil {
		return fmt.Errorf("stamping a snapshot at slot %d: %w", sv.slot, res.err)
	}
	sv.meta = res.meta
	return nil
}

// poll takes the stamp if it arrived (never blocks).
func (sv *snapServe) poll() (bool, error) {
	if sv.stamped {
		return true, nil
	}
	select {
	case res := <-sv.metaC:
		return true, sv.stamp(res)
	default:
		return false, nil
	}
}

// next returns the next frame payload (the header, the chunks of the
// stream, the end frame; last on the end frame). It must be stamped. The
// payload is valid until the next call.
func (sv *snapServe) next() (payload []byte, last bool, err error) {
	r := sv.r
	switch {
	case sv.ended:
		return nil, true, io.EOF
	case !sv.headed:
		sv.headed = true
		sv.out = appendSnapHeader(sv.out[:0], sv.id, &sv.meta)
		return sv.out, false, nil
	}
	if sv.buf == nil {
		sv.buf = make([]byte, snapshotChunkBytes)
	}
	var n int
	if sv.delta {
		n, err = sv.rc.Read(sv.buf)
		if n == 0 && err == nil {
			return sv.next()
		}
	} else {
		n, err = io.ReadFull(sv.rc, sv.buf)
	}
	if n > 0 {
		sv.seq++
		sv.sent += uint64(n)
		r.metrics.Snap.SentBytes.Add(float64(n))
		r.pins.extend(sv.pin, r.cfg.Now().Add(snapshotStallTimeout))
		sv.out = appendSnapChunk(sv.out[:0], sv.id, sv.seq, sv.buf[:n])
		return sv.out, false, nil
	}
	if !errors.Is(err, io.EOF) {
		return nil, false, fmt.Errorf("reading the snapshot stream: %w", err)
	}
	sv.ended = true
	sv.out = appendSnapEnd(sv.out[:0], sv.id, sv.seq, sv.sent)
	return sv.out, true, nil
}

// close releases the transfer: the stream and its Pebble snapshot, the
// serving slot, and (after snapshotRetainAfter) the log pin.
func (sv *snapServe) close() {
	if sv.closed {
		return
	}
	sv.closed = true
	r := sv.r
	sv.rc.Close()
	if !sv.stamped {
		// The stamp may still come: its pin then expires on its own
		// (snapshotStallTimeout).
		select {
		case res := <-sv.metaC:
			sv.pin = res.pin
		default:
		}
	}
	r.pins.extend(sv.pin, r.cfg.Now().Add(snapshotRetainAfter))
	<-r.snapServes
	m := &r.metrics.Snap
	m.InFlight.WithLabelValues(dirSent).Dec()
	result := resultFailed
	if sv.ended {
		result = resultOK
		r.metrics.SnapshotBytes.Set(float64(sv.sent))
		r.log.Info().Uint64("to", uint64(sv.to)).Uint64("slot", sv.slot).Uint64("bytes", sv.sent).Bool("delta", sv.delta).
			Dur("took", r.cfg.Now().Sub(sv.start)).Msg("snapshot sent")
	}
	m.Transfers.WithLabelValues(dirSent, result).Inc()
	m.Seconds.WithLabelValues(dirSent).Observe(r.cfg.Now().Sub(sv.start).Seconds())
}

// serveSnapshotConn serves one transfer connection (the side channel hands
// it over after its magic): one request, then the transfer. It runs on the
// side channel's receiver goroutine, which closes c afterwards.
func (r *Replica) serveSnapshotConn(c net.Conn, br *bufio.Reader) {
	sc := newSnapConn(c, br, r.cfg.Auth)
	b, err := sc.read()
	if err != nil {
		if isTimeout(err) {
			// SNP1 and no request in time: held a connection slot for
			// nothing (an outside tester's idle transfer connections).
			err = fmt.Errorf("%w: %w", errUnprovenTimeout, err)
			if r.cfg.Auth != nil {
				r.cfg.Auth.reject(err)
			}
		}
		r.snapConnRefused(c, err)
		return
	}
	req, err := decodeSnapFrame(b)
	if err == nil && !isSnapRequest(req.kind) {
		err = fmt.Errorf("%w: kind %d before a request", errSnapFrame, req.kind)
	}
	if err == nil && req.to != r.cfg.ID && !testingSnapRequestUnaddressed {
		// An unaddressed request (a node of the version before) is
		// refused too: it could be a replay of one sent to another member.
		err = fmt.Errorf("%w: request to node %d (0: a request of an earlier version, which names no server)", errSnapMisaddressed, req.to)
		if r.cfg.Auth != nil {
			r.cfg.Auth.reject(err)
		}
	}
	if err == nil && r.cfg.Auth != nil && req.from != sc.peer {
		err = fmt.Errorf("%w: request names node %d, sealed by %d", errSnapFrame, req.from, sc.peer)
	}
	if err == nil && (!r.isMember(req.from) || req.from == r.cfg.ID) {
		// A departed member stays in the address book for a while (to
		// hear of its removal) and may still hold the cluster secret: it
		// is no longer sent the log, so it gets no snapshot either.
		err = fmt.Errorf("%w: request from node %d, not a member", errSnapFrame, req.from)
	}
	if err != nil {
		r.snapConnRefused(c, err)
		return
	}
	sv, err := r.serveBegin(req.from, req.id, req.digest)
	if err != nil {
		r.log.Debug().Err(err).Uint64("to", uint64(req.from)).Msg("refusing a snapshot transfer")
		reason := byte(snapRefuseBusy)
		if errors.Is(err, sm.ErrBadDigest) {
			reason = snapRefuseBadReq
		}
		sc.write(appendSnapRefuse(nil, req.id, reason))
		r.metrics.Snap.Transfers.WithLabelValues(dirSent, resultRefused).Inc()
		return
	}
	defer sv.close()
	select {
	case res := <-sv.metaC:
		err = sv.stamp(res)
	case <-time.After(snapshotMetaWait):
		err = errors.New("the consensus loop did not stamp the snapshot in time")
	case <-r.stop:
		return
	}
	if err != nil {
		r.log.Warn().Err(err).Uint64("to", uint64(req.from)).Msg("refusing a snapshot transfer")
		sc.write(appendSnapRefuse(nil, req.id, snapRefuseNoState))
		return
	}
	for {
		p, last, err := sv.next()
		if err == nil {
			err = sc.write(p)
		}
		if err != nil {
			r.log.Info().Err(err).Uint64("to", uint64(req.from)).Uint64("slot", sv.slot).Uint64("sent", sv.sent).
				Msg("snapshot transfer failed")
			return
		}
		if last {
			return
		}
	}
}

// snapConnRefused counts and logs a transfer connection refused before
// it began: authentication failures, misaddressed requests and idle
// connections in AuthRefused (with the side channel's), anything else
// that is not a clean close (a malformed or undecodable request) in
// InboundDropped; at most one line per authRejectLogPeriod. A node
// without a cluster secret (a one-node cluster may run so) counted and
// logged none of its refusals (an outside tester's 1,200 hostile
// connections left both counters at 0).
func (r *Replica) snapConnRefused(c net.Conn, err error) {
	switch {
	case isRefusal(err):
		r.metrics.AuthRefused.Inc()
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed):
		r.log.Debug().Err(err).Str("remote", c.RemoteAddr().String()).Msg("snapshot transfer connection closed before its request")
		return
	default:
		r.metrics.InboundDropped.Inc()
	}
	const msg = "refusing a snapshot transfer connection (failed authentication, asked another node, sent no request in time, or malformed)"
	if a := r.cfg.Auth; a != nil {
		if a.shouldLog(time.Now()) {
			r.log.Warn().Err(err).Str("remote", c.RemoteAddr().String()).Uint64("refused_total", a.Rejected()).Msg(msg)
		}
	} else if ok, held := r.snapRefuseLog.Allow(time.Now()); ok {
		r.log.Warn().Err(err).Str("remote", c.RemoteAddr().String()).Uint64("refusals_left_out", held).Msg(msg)
	}
}
