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
)

// Response sizes. A request reserves responseBytesReserved before its
// frame is read; that covers every answer but a GET's or CAS's value, a
// SCAN's pairs and a STATUS of many members. A GET's value and a SCAN's
// pairs are charged before they are copied (value_room.go): a SCAN's page
// ends before the first pair with no room, and is THROTTLED only when that
// is its first. Any other answer larger than its reservation takes the
// difference when it is encoded, or, when a budget has no room for it, is
// replaced by THROTTLED (which fits the reservation).
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
	// largest SCAN reply (its room check charges at most a pair's
	// getAnswerOverheadBytes beyond it, which the reservation covers) and
	// the reservation of the next frame.
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
