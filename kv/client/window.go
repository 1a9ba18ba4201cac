package client

import (
	"context"
	"sync"
)

// writeWindow hands out write sequences so that the client never causes
// SEQUENCE_STALE on itself.
//
// The server remembers the results of at most sm.ResultsPerClientMax
// (= writesInflightMax) writes per client, and drops every result below
// the highest "first unacked" it has seen. A result the client may still
// retry is therefore safe only while every sequence the client has in
// flight lies within writesInflightMax of its lowest unanswered one. So the
// window bounds the span of sequences, not merely their count: sequence s
// is handed out only once s - low < writesInflightMax, where low is the
// lowest sequence still unanswered. Bounding the count alone (what the
// client did before) let one slow write at s and 255 newer ones completing
// push sequences past s+256; the server's window then slid past s, and s's
// own first attempt or retry was answered SEQUENCE_STALE.
//
// Why the span bound suffices: every attempt of write m carries first
// unacked >= low at the moment m was handed out > m - writesInflightMax.
// When the server applies the write with the highest sequence M it has
// seen, its floor rises to at least M - writesInflightMax + 1, so it never
// holds more than writesInflightMax results and never drops one by count;
// its floor rises only to a first unacked, which passes a sequence only
// after the client ended that write (answered, or given up on).
//
// Writers that find no room wait in FIFO order; each is bounded by its own
// ctx, so the queue holds at most one entry per blocked caller.
type writeWindow struct {
	mu sync.Mutex
	// next is the next sequence to hand out (sequences start at 1).
	next uint64
	// low is the lowest sequence handed out and not yet ended; next when
	// none is in flight. Invariant: low <= next, next - low <= writesInflightMax.
	low uint64
	// ended[s % writesInflightMax] marks sequence s in [low, next) ended
	// (answered or given up on) while a lower one is still in flight.
	ended   [writesInflightMax]bool
	waiters []*windowWaiter // FIFO
	// maxSpan is the largest next - low seen after a hand-out (tests).
	maxSpan uint64
}

type windowWaiter struct {
	seq chan uint64 // cap 1: the sequence granted
}

func (w *writeWindow) init() {
	w.next, w.low = 1, 1
}

// begin returns the next sequence once the window has room for it, or
// ctx's error (no sequence taken).
func (w *writeWindow) begin(ctx context.Context) (uint64, error) {
	w.mu.Lock()
	if len(w.waiters) == 0 && w.room() {
		s := w.take()
		w.mu.Unlock()
		return s, nil
	}
	wt := &windowWaiter{seq: make(chan uint64, 1)}
	w.waiters = append(w.waiters, wt)
	w.mu.Unlock()
	select {
	case s := <-wt.seq:
		return s, nil
	case <-ctx.Done():
	}
	w.mu.Lock()
	for i, x := range w.waiters {
		if x == wt {
			w.waiters = append(w.waiters[:i], w.waiters[i+1:]...)
			w.mu.Unlock()
			return 0, ctx.Err()
		}
	}
	w.mu.Unlock()
	// Granted while giving up: the sequence was never sent, so ending it
	// at once is the same as never having taken it.
	w.end(<-wt.seq)
	return 0, ctx.Err()
}

// room reports whether sequence next may be handed out (under mu).
func (w *writeWindow) room() bool { return w.next-w.low < writesInflightMax }

// take hands out sequence next (under mu, with room).
func (w *writeWindow) take() uint64 {
	s := w.next
	w.next++
	w.maxSpan = max(w.maxSpan, w.next-w.low)
	return s
}

// end records that write s has its answer, or that its caller gave up on
// it: its outcome is then unknown, it will not be retried, and first
// unacked may move past it. Waiters get the room this makes.
func (w *writeWindow) end(s uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s < w.low || s >= w.next {
		panic("client: ending a write sequence that is not in flight")
	}
	w.ended[s%writesInflightMax] = true
	for w.low < w.next && w.ended[w.low%writesInflightMax] {
		w.ended[w.low%writesInflightMax] = false
		w.low++
	}
	for len(w.waiters) > 0 && w.room() {
		wt := w.waiters[0]
		w.waiters[0] = nil
		w.waiters = w.waiters[1:]
		wt.seq <- w.take()
	}
	if len(w.waiters) == 0 {
		w.waiters = nil // let a grown queue's array go
	}
}

// first is the write identity's "first unacked" for an attempt of write
// s: the lowest sequence in flight (s at most).
func (w *writeWindow) first(s uint64) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return min(w.low, s)
}
