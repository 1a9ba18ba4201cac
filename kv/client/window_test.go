package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/tenants"
)

// jitterBackend delays every write by a random 0..writeJitterMax before
// applying it, so writes pipelined on one connection finish out of order
// (as they do behind a replicated leader: batching, retransmissions, a
// slow apply). That is what let the client's sequence span outgrow the
// server's exactly-once window.
func jitterBackend(t testing.TB, writeJitterMax time.Duration) funcBackend {
	lb := localBackend(t)
	return func(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
		if req.Op.IsWrite() {
			d := time.Duration(rand.Int64N(int64(writeJitterMax)))
			if req.Seq%97 == 0 {
				d = 20 * writeJitterMax // a straggler holds first unacked back
			}
			time.Sleep(d)
		}
		return lb.Do(ctx, tenant, req)
	}
}

// TestManyWritersNeverSequenceStale: with far more concurrent writers than
// the exactly-once window on one client, the client never causes
// SEQUENCE_STALE on its own writes, and every write applies exactly once.
// The client used to bound only the count of unanswered writes: a slow
// write (seq s) plus 255 newer ones completing let sequences run past
// s+256, the server's window slid past s and s's own first attempt, or a
// retry, was answered SEQUENCE_STALE.
func TestManyWritersNeverSequenceStale(t *testing.T) {
	const (
		writers         = 600 // more than the window (writesInflightMax = 256)
		writesPerWriter = 8
		writeJitterMax  = 2 * time.Millisecond
	)
	addr := startServer(t, jitterBackend(t, writeJitterMax))
	c := dial(t, []string{addr}, Options{RequestTimeout: time.Minute})
	var stale, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < writesPerWriter; i++ {
				k := []byte(fmt.Sprintf("w%03d-%d", w, i))
				// A create-if-absent CAS: applied twice, it would fail.
				err := c.CAS(context.Background(), k, nil, k)
				switch {
				case errors.Is(err, ErrSequenceStale):
					stale.Add(1)
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if n := stale.Load(); n != 0 {
		t.Errorf("%d writes answered SEQUENCE_STALE; want 0", n)
	}
	if n := failed.Load(); n != 0 {
		t.Errorf("%d writes failed, first: %v", n, firstErr.Load())
	}
	// Every key is there once (a scan counts them).
	total := 0
	var start []byte
	for {
		pairs, more, err := c.Scan(context.Background(), start, nil, proto.ScanLimitMax)
		if err != nil {
			t.Fatal(err)
		}
		total += len(pairs)
		if !more {
			break
		}
		start = append(append([]byte(nil), pairs[len(pairs)-1].Key...), 0)
	}
	if total != writers*writesPerWriter {
		t.Errorf("%d keys stored, want %d", total, writers*writesPerWriter)
	}
	c.win.mu.Lock()
	maxSpan := c.win.maxSpan
	c.win.mu.Unlock()
	t.Logf("client window: writers=%d writes=%d stale=%d max seq span=%d (window %d)",
		writers, writers*writesPerWriter, stale.Load(), maxSpan, writesInflightMax)
	if maxSpan > writesInflightMax {
		t.Errorf("sequence span %d exceeded the window %d", maxSpan, writesInflightMax)
	}
}

// TestWindowGivesUpCleanly: writers that give up while waiting for room in
// the window (their ctx ends) neither take a sequence nor hold one, and
// the window keeps working for the others.
func TestWindowGivesUpCleanly(t *testing.T) {
	var w writeWindow
	w.init()
	ctx := context.Background()
	var seqs []uint64
	for i := 0; i < writesInflightMax; i++ {
		s, err := w.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	if got := w.first(seqs[len(seqs)-1]); got != 1 {
		t.Fatalf("first unacked %d, want 1", got)
	}
	// The window is full: a writer waits, and gives up.
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := w.begin(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("begin on a full window: %v, want the deadline", err)
	}
	// A writer waiting when the lowest write ends gets the next sequence.
	got := make(chan uint64, 1)
	go func() {
		s, err := w.begin(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	// Ending a write that is not the lowest makes no room.
	w.end(seqs[5])
	select {
	case s := <-got:
		t.Fatalf("got sequence %d before the lowest write ended", s)
	case <-time.After(20 * time.Millisecond):
	}
	w.end(seqs[0])
	if s := <-got; s != writesInflightMax+1 {
		t.Fatalf("next sequence %d, want %d", s, writesInflightMax+1)
	}
	if f := w.first(writesInflightMax + 1); f != 2 {
		t.Fatalf("first unacked %d, want 2", f)
	}
}
