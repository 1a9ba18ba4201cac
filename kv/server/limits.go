package server

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/proto"
	"synod/tenants"
)

// Response sizes. A request reserves responseBytesReserved before its
// frame is read; that covers every answer but a GET's or CAS's value, a
// SCAN's pairs and a STATUS of many members. A SCAN reserves its largest
// possible reply once its body is decoded; any other answer larger than
// its reservation takes the difference when it is encoded, or, when a
// budget has no room for it, is replaced by THROTTLED (which fits the
// reservation).
const (
	// errorResponseBytesMax is the largest error frame without a value:
	// header, retry after, failed op, has value, an empty value, the
	// longest leader address and message.
	errorResponseBytesMax = proto.HeaderBytes + 8 + 4 + 1 + 4 + 2 + proto.AddrBytesMax + 2 + proto.MessageBytesMax
	// responseBytesReserved is what each request holds in the connection's,
	// tenant's and node's budgets from before its frame is read until its
	// answer is written (or it grows, see above): every error answer, and
	// a GET of a value up to about 4 KB.
	responseBytesReserved = 4 << 10
	// ResponseBytesReserved is responseBytesReserved, for a configuration
	// that derives the response budgets (kvnode) and must keep Validate's
	// order.
	ResponseBytesReserved = responseBytesReserved
	// scanResponseBytesMax is the largest SCAN reply: the scan stops once
	// it holds ScanReplyBytesMax of keys and values, so it holds at most
	// one byte less than that plus one more pair, and a length prefix per
	// pair (kv/sm.Scan).
	scanResponseBytesMax = proto.HeaderBytes + 4 + proto.ScanReplyBytesMax - 1 + proto.KeyBytesMax + proto.ValueBytesMax +
		proto.ScanLimitMax*(2+4) + 1
	// ResponseBytesPerConnMin is the least ResponseBytesPerConnMax: one
	// largest SCAN reply and the reservation of the next frame.
	ResponseBytesPerConnMin = scanResponseBytesMax + responseBytesReserved
	// budgetRetryAfter is the retry-after of a request THROTTLED for want
	// of response budget: writers drain budgets at network speed, so room
	// comes back within milliseconds unless a client is not reading.
	budgetRetryAfter = 10 * time.Millisecond
	// connsRetryAfter is the retry-after of a HELLO refused for the
	// tenant's connection cap: a slot frees when a connection closes.
	connsRetryAfter = 100 * time.Millisecond
	// logLinesPerSecMax bounds the log lines about refused connections and
	// bad frames (one limiter each for warnings and per-request notices).
	logLinesPerSecMax = 20
	logWindow         = time.Second
)

// A THROTTLED answer must fit any reservation it replaces.
var _ [responseBytesReserved - errorResponseBytesMax]struct{}

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

// reserveScan raises a SCAN's reservation from held to the largest reply
// a SCAN of limit pairs can have: it waits for the connection's own
// budget and takes the tenant's and node's only if they have room now,
// or, when they have room for a smaller limit's reply only, takes that
// (shorterScan). It returns the bytes the request then holds and the
// limit to scan with; or a THROTTLED answer (counted, holding held) when
// not even one pair's reply fits; or open false (holding held) when the
// connection ended while it waited. Both protocols' SCANs reserve here.
func (c *conn) reserveScan(held int64, limit uint32) (holds int64, scanLimit uint32, throttled *proto.Response, open bool) {
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
	return proto.Errorf(proto.StatusThrottled, "no room for a SCAN reply of even one pair (up to %d bytes; %d for the limit of %d asked): it %s", one, need, limit, full.refusal())
}

// responseBytesHint is about the encoded size of resp (exactly, for the
// large ones), so a megabyte answer is encoded into one allocation rather
// than a series of doublings.
func responseBytesHint(resp *proto.Response) int {
	n := int(getAnswerBytesMax(len(resp.Value)))
	for _, kv := range resp.Pairs {
		n += 2 + len(kv.Key) + 4 + len(kv.Value)
	}
	return n
}

// budget counts bytes against a bound. Adds never pass max; a waiter is
// woken by every release while it waits. A nil *budget is unlimited and
// counts nothing (a connection's tenant budget before HELLO).
type budget struct {
	used    atomic.Int64
	peak    atomic.Int64
	max     int64
	waiters atomic.Int32
	// heavyAt is when (unix ns) a tenant's budget last held more than the
	// reserve's light bound (node_reserve.go); unused at other levels.
	heavyAt atomic.Int64
	mu      sync.Mutex
	wake    chan struct{} // closed and replaced by a release while waiters > 0
}

func newBudget(max int64) *budget {
	return &budget{max: max, wake: make(chan struct{})}
}

// tryAdd takes n bytes if they fit.
func (b *budget) tryAdd(n int64) bool {
	if b == nil {
		return true
	}
	return b.tryAddWithin(n, b.max)
}

// tryAddWithin takes n bytes if used stays within limit (at most max)
// with them: the node's budget gives a tenant that is not light only its
// shared part (node_reserve.go).
func (b *budget) tryAddWithin(n, limit int64) bool {
	limit = min(limit, b.max)
	for {
		u := b.used.Load()
		if u+n > limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			for p := b.peak.Load(); u+n > p && !b.peak.CompareAndSwap(p, u+n); p = b.peak.Load() {
			}
			return true
		}
	}
}

// release gives n bytes back and wakes the waiters.
func (b *budget) release(n int64) {
	if b == nil || n == 0 {
		return
	}
	if u := b.used.Add(-n); u < 0 {
		panic("server: response budget released below zero")
	}
	if b.waiters.Load() > 0 {
		b.mu.Lock()
		close(b.wake)
		b.wake = make(chan struct{})
		b.mu.Unlock()
	}
}

// wait takes n bytes, waiting for releases until they fit; false when ctx
// ends first. n must not exceed max.
func (b *budget) wait(ctx context.Context, n int64) bool {
	if b == nil {
		return true
	}
	return b.waitWithin(ctx, n, func() int64 { return b.max })
}

// waitWithin is wait for tryAddWithin, with the limit asked again at each
// try: a tenant's limit on the node's budget rises when its own answers
// are written.
func (b *budget) waitWithin(ctx context.Context, n int64, limit func() int64) bool {
	if b.tryAddWithin(n, limit()) {
		return true
	}
	b.waiters.Add(1)
	defer b.waiters.Add(-1)
	for {
		// Take the channel before checking again: a release after the
		// check closes this channel (waiters > 0 is already visible).
		b.mu.Lock()
		ch := b.wake
		b.mu.Unlock()
		if b.tryAddWithin(n, limit()) {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// logLimiter lets at most logLinesPerSecMax lines through per logWindow
// and counts the rest; the next line let through carries that count.
type logLimiter struct {
	mu         sync.Mutex
	now        func() time.Time
	start      time.Time
	lines      int
	suppressed int
	total      atomic.Uint64 // lines suppressed ever
}

// event returns ev with the count of lines suppressed before it, or nil
// (which zerolog treats as a disabled event) when this line is over the
// rate. A nil ev (level disabled) is not counted.
func (l *logLimiter) event(ev *zerolog.Event) *zerolog.Event {
	if ev == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := l.now(); now.Sub(l.start) >= logWindow || now.Before(l.start) {
		l.start, l.lines = now, 0
	}
	if l.lines >= logLinesPerSecMax {
		l.suppressed++
		l.total.Add(1)
		return nil
	}
	l.lines++
	if l.suppressed > 0 {
		ev = ev.Int("suppressed", l.suppressed)
		l.suppressed = 0
	}
	return ev
}

// sourceOf is the address a connection's source cap counts: the IP, or
// for IPv6 its /64 (one host usually holds a whole /64).
func sourceOf(a net.Addr) netip.Addr {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return ip
}

// connList is the pre-HELLO connections in accept order (oldest first),
// linked through conn.prev/next. Guarded by Server.mu.
type connList struct {
	head, tail *conn
	n          int
}

func (l *connList) pushBack(c *conn) {
	c.prev, c.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = c
	} else {
		l.head = c
	}
	l.tail = c
	l.n++
}

func (l *connList) remove(c *conn) {
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		l.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		l.tail = c.prev
	}
	c.prev, c.next = nil, nil
	l.n--
}

// oldestFrom is the oldest connection from src, or nil.
func (l *connList) oldestFrom(src netip.Addr) *conn {
	for c := l.head; c != nil; c = c.next {
		if c.source == src {
			return c
		}
	}
	return nil
}
