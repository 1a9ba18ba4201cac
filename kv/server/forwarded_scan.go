package server

import (
	"synod/kv/proto"
	"synod/tenants"
)

// Forwarded SCANs. A SCAN this node serves is charged pair by pair as it
// reads (value_room.go). One a RESP follower forwards to the leader
// (docs/resp.md: a connection without READONLY) comes back whole, values
// included, though RESP's SCAN sends only keys: it cannot be charged as
// it is read, so it reserves, before it is forwarded, the largest reply
// its limit allows, forwarding a smaller limit when only a smaller reply
// finds room. Without the reservation each connection forwarding a SCAN
// would hold a reply of up to 3.15 MB outside every budget.

// scanReplyBytesMax is the most bytes a SCAN with this limit can be
// answered with, for a tenant with spec's key and value limits.
func scanReplyBytesMax(limit uint32, spec tenants.Spec) int64 {
	kmax, vmax := int64(proto.KeyBytesMax), int64(proto.ValueBytesMax)
	if spec.MaxKeyBytes > 0 {
		kmax = min(kmax, int64(spec.MaxKeyBytes))
	}
	if spec.MaxValueBytes > 0 {
		vmax = min(vmax, int64(spec.MaxValueBytes))
	}
	n := int64(max(1, min(limit, proto.ScanLimitMax)))
	pairs := min(n*(kmax+vmax), proto.ScanReplyBytesMax-1+kmax+vmax)
	return min(proto.HeaderBytes+4+n*(2+4)+pairs+1, scanResponseBytesMax)
}

// reserveForwardedScan raises a forwarded SCAN's reservation from held to
// the largest reply a SCAN of limit pairs can have: it waits for the
// connection's own budget and takes the tenant's and node's only if they
// have room now, or, when they have room for a smaller limit's reply
// only, takes that (shorterScan). It returns the bytes the request then
// holds and the limit to forward; or a THROTTLED answer (counted, holding
// held) when not even one pair's reply fits; or open false (holding held)
// when the connection ended while it waited.
func (c *conn) reserveForwardedScan(held int64, limit uint32) (holds int64, scanLimit uint32, throttled *proto.Response, open bool) {
	need := scanReplyBytesMax(limit, c.spec)
	if need <= held {
		return held, limit, nil, true
	}
	extra := need - held
	if !c.queued.wait(c.ctx, extra) {
		return held, 0, nil, false
	}
	full := c.tryChargeSharedOrFull(extra)
	if full == budgetNone {
		return need, limit, nil, true
	}
	// No room for the largest reply: a shorter SCAN, if one pair's reply
	// fits (More tells the client to go on).
	shorter, holds := c.shorterScan(limit, held)
	if shorter == 0 {
		c.queued.release(extra)
		c.countThrottled()
		r := c.scanThrottled(limit, full)
		r.RetryAfter = budgetRetryAfter
		return held, 0, r, true
	}
	c.queued.release(need - holds)
	return holds, shorter, nil, true
}

// shorterScan is, for a SCAN of limit pairs whose largest reply finds no
// room in the tenant's or the node's response budget, the largest smaller
// limit whose reply fits what they have now, charged to them beyond held:
// it returns that limit and the bytes the request then holds, or 0 when
// not even one pair's reply fits (nothing charged). Scanning fewer pairs
// with More set is an answer the client continues from; THROTTLED, which
// an outside tester's SCANs of small values got 8 % of the time beside
// the tenant's other SCANs (each reserving 3.15 MB), is no progress.
func (c *conn) shorterScan(limit uint32, held int64) (uint32, int64) {
	room := min(c.tbudget.max-c.tbudget.used.Load(), c.nodeLimit()-c.s.node.used.Load())
	lo, hi := uint32(0), max(1, min(limit, proto.ScanLimitMax))-1 // lo fits (0: nothing), hi may not
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if scanReplyBytesMax(mid, c.spec)-held <= room {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	if lo == 0 {
		return 0, held
	}
	need := scanReplyBytesMax(lo, c.spec)
	if need > held && c.tryChargeSharedOrFull(need-held) != budgetNone {
		return 0, held
	}
	return lo, max(need, held)
}

// scanThrottled is the THROTTLED answer for a SCAN of limit pairs when
// not even one pair's reply fits (shorterScan found none): it names the
// one-pair reservation that failed, not only the limit's.
func (c *conn) scanThrottled(limit uint32, full budgetFull) *proto.Response {
	one, need := scanReplyBytesMax(1, c.spec), scanReplyBytesMax(limit, c.spec)
	return proto.Errorf(proto.StatusThrottled, "no room to forward a SCAN to the leader: its reply is reserved before it goes, and not even one pair's fits (up to %d bytes; %d for the limit of %d asked): it %s", one, need, limit, full.refusal())
}

// ReserveForwardedScan raises the reservation of a SCAN about to be
// forwarded to the leader from held (reserveForwardedScan): it returns
// the bytes the request holds afterwards and the limit to forward
// (smaller than limit when only a smaller reply finds room), or a
// THROTTLED or UNAVAILABLE answer (holding held).
func (h *Hosted) ReserveForwardedScan(held int64, limit uint32) (int64, uint32, *proto.Response) {
	holds, scanLimit, throttled, open := h.c.reserveForwardedScan(held, limit)
	if !open {
		return held, 0, proto.Errorf(proto.StatusUnavailable, "connection closing")
	}
	return holds, scanLimit, throttled
}
