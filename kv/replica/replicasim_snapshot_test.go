package replica

import (
	"errors"

	"synod/paxos"
)

// Snapshot transfers in the replica simulator. A node's offers
// (Replica.snapOffers, filled by finishReady) start a transfer driven one
// step at a time through the runtime's own code: fetchBegin and the
// request frame on the fetcher, serveBegin on the server (its Pebble
// snapshot; the stamp comes when the server's consensus loop runs the
// control function), the server's frames (next) into the fetcher's onFrame
// (staging chunk by chunk, sm.Stager), then installAsk (InstallSnapshot on
// the fetcher's consensus loop) and the apply loop's swap (installStaged).
// Only the TCP and sealing layer is left out (snapshot_wire_test.go and
// the e2e tests run it). The seed chooses how many frames move per step,
// stalls, broken links (a partition, or a cut at a chunk boundary), and
// crashes of the fetcher at a chunk boundary; crashes of either node
// through the ordinary fault schedule land anywhere in a transfer.
// Checks: a fetcher never stops with an error (the replica's fatal
// channel), a staging never outlives a transfer, and porcupine over every
// read, so a wrong install shows as a wrong answer.

// Transfer fault rates, per transfer step, in parts per 100,000.
const (
	rsimXferCutPer100k       = 1_500 // the link breaks
	rsimXferCrashPer100k     = 2_000 // the fetcher crashes at a chunk boundary
	rsimXferFramesPerStepMax = 3
	rsimChunkBytes           = 512 // small chunks: many boundaries
)

// rsimXfer is one transfer in flight to node to.
type rsimXfer struct {
	from           *rsimNode
	fromInc, toInc int
	fetch          *snapFetch
	serve          *snapServe
	install        *snapInstall
	swapping       bool
}

// xferCounts tallies the simulator's transfers.
type xferCounts struct {
	started, installed, failed, stale, crashes int
}

func (c *xferCounts) add(o xferCounts) {
	c.started += o.started
	c.installed += o.installed
	c.failed += o.failed
	c.stale += o.stale
	c.crashes += o.crashes
}

// transferStep advances node n's transfer, or starts one for a waiting
// offer.
func (s *rsim) transferStep(n *rsimNode) {
	if !s.up(n) || s.paused(n) {
		return
	}
	x := n.xfer
	if x == nil {
		s.startTransfer(n)
		return
	}
	switch {
	case x.install != nil:
		s.installStep(n, x)
		return
	case !s.up(x.from) || x.from.incarnation != x.fromInc:
		s.endTransfer(n, errors.New("the server crashed"))
		return
	case s.blocked[[2]paxos.NodeID{x.from.id, n.id}] || s.blocked[[2]paxos.NodeID{n.id, x.from.id}]:
		s.endTransfer(n, errors.New("partitioned"))
		return
	case s.faults && s.rng.IntN(100_000) < rsimXferCutPer100k:
		s.endTransfer(n, errors.New("the link broke"))
		return
	case s.paused(x.from):
		return // a paused server writes nothing; the stall timeout is far
	}
	ok, err := x.serve.poll()
	if err != nil {
		s.endTransfer(n, err)
		return
	}
	if !ok {
		return // the server's consensus loop has not stamped it yet
	}
	for range 1 + s.rng.IntN(rsimXferFramesPerStepMax) {
		p, _, err := x.serve.next()
		if err != nil {
			s.endTransfer(n, err)
			return
		}
		done, err := x.fetch.onFrame(append([]byte(nil), p...))
		if err != nil {
			s.endTransfer(n, err)
			return
		}
		if done {
			x.serve.close()
			x.install = &snapInstall{meta: x.fetch.meta}
			return
		}
		if s.faults && s.rng.IntN(100_000) < rsimXferCrashPer100k {
			// A crash at a chunk boundary: the partial staging stays on
			// disk (sm.Abandon), and the reopen must discard it.
			s.res.xfer.crashes++
			s.stop(n, true)
			n.downUntil = s.now + s.between(1_000, 10_000)
			s.res.restarts++
			return
		}
	}
}

// startTransfer starts a transfer for node n's newest offer.
func (s *rsim) startTransfer(n *rsimNode) {
	var o paxos.SnapshotOffer
	select {
	case o = <-n.r.snapOffers:
	default:
		return
	}
	if n.r.Status().Commit >= o.Meta.Slot {
		return
	}
	from := s.nodes[o.From-1]
	if !s.up(from) || s.blocked[[2]paxos.NodeID{n.id, from.id}] {
		return // the dial fails; the offer comes again
	}
	f, err := n.r.fetchBegin(o)
	if err != nil {
		s.violate("node %d: cannot stage a snapshot: %v", n.id, err)
		return
	}
	req, err := decodeSnapFrame(f.request())
	wantKind := byte(snapFrameAddressedRequest)
	if f.digest != nil {
		wantKind = snapFrameAddressedDeltaRequest
	}
	if err != nil || req.kind != wantKind || req.from != n.id || req.to != from.id || req.id != f.id {
		s.violate("node %d: its request frame does not decode: %+v %v", n.id, req, err)
	}
	sv, err := from.r.serveBegin(n.id, req.id, req.digest)
	if err != nil {
		f.end(errSnapRefused)
		return
	}
	n.xfer = &rsimXfer{from: from, fromInc: from.incarnation, toInc: n.incarnation, fetch: f, serve: sv}
	s.res.xfer.started++
}

// installStep hands a complete staging to paxos, then waits for the swap.
func (s *rsim) installStep(n *rsimNode, x *rsimXfer) {
	r := n.r
	in := x.install
	if x.swapping {
		select {
		case err := <-r.snapSwapped:
			s.finishTransfer(n, err)
		default:
		}
		return
	}
	if !in.asked {
		r.installAsk(in)
		return
	}
	select {
	case err := <-in.verdict:
		switch {
		case errors.Is(err, errInstallLater):
			in.asked = false
		case err != nil:
			if derr := r.sm.DiscardStaged(); derr != nil {
				s.violate("node %d: discarding a staged snapshot: %v", n.id, derr)
			}
			s.finishTransfer(n, err)
		default:
			x.swapping = true
		}
	default:
	}
}

// finishTransfer ends node n's transfer after its install (or refusal).
func (s *rsim) finishTransfer(n *rsimNode, err error) {
	x := n.xfer
	n.xfer = nil
	x.fetch.end(err)
	switch {
	case err == nil:
		s.res.xfer.installed++
	case errors.Is(err, errSnapStale) || errors.Is(err, paxos.ErrSnapshotStale):
		s.res.xfer.stale++
	default:
		s.violate("node %d: installing snapshot %d: %v", n.id, x.fetch.meta.Slot, err)
	}
	if n.store.StagedSlot() != 0 {
		s.violate("node %d: a staged snapshot outlived its transfer", n.id)
	}
}

// endTransfer ends node n's transfer before its install: the staging is
// aborted and the server released.
func (s *rsim) endTransfer(n *rsimNode, err error) {
	x := n.xfer
	n.xfer = nil
	x.serve.close()
	x.fetch.end(err)
	if errors.Is(err, errSnapStale) {
		s.res.xfer.stale++
	} else {
		s.res.xfer.failed++
	}
}

// dropTransfer forgets node n's transfer when n crashes (its staging is
// left as the crash leaves it; the server is released).
func (s *rsim) dropTransfer(n *rsimNode) {
	if x := n.xfer; x != nil {
		n.xfer = nil
		if x.install == nil {
			x.serve.close()
		}
	}
}
