package sm

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/tenants"
)

// TestReadSlotsFor: without ReadSlots the slots follow the cache (half of
// it in ReadSlotPinBytes), and ReadSlotsFor follows the bytes reserved,
// within ReadSlotsMin..ReadSlotsMax, at each boundary.
func TestReadSlotsFor(t *testing.T) {
	for _, c := range []struct {
		name string
		f    func(int64) int
		per  int64 // bytes per slot
	}{
		{"readSlotsFor(cache)", readSlotsFor, readSlotsCacheDivisor * ReadSlotPinBytes},
		{"ReadSlotsFor(pin)", ReadSlotsFor, ReadSlotPinBytes},
	} {
		per := c.per
		for _, b := range []struct {
			bytes int64
			want  int
		}{
			{per*ReadSlotsMin - 1, ReadSlotsMin},
			{per * (ReadSlotsMin + 1), ReadSlotsMin + 1},
			{per*(ReadSlotsMin+1) - 1, ReadSlotsMin},
			{per * ReadSlotsMax, ReadSlotsMax},
			{per*ReadSlotsMax - 1, ReadSlotsMax - 1},
			{per * ReadSlotsMax * 4, ReadSlotsMax},
		} {
			if got := c.f(b.bytes); got != b.want {
				t.Errorf("%s: %d bytes: %d slots, want %d", c.name, b.bytes, got, b.want)
			}
		}
	}
	if got := readSlotsFor(0); got != ReadSlotsMin {
		t.Errorf("readSlotsFor(0) = %d, want %d (Pebble's 8 MiB default cache)", got, ReadSlotsMin)
	}
	if ScanReadSlots > ReadSlotsMin {
		t.Errorf("ScanReadSlots %d > ReadSlotsMin %d: a SCAN would always take every slot of the smallest node", ScanReadSlots, ReadSlotsMin)
	}
}

// TestReadSlotsOption: Options.ReadSlots sets the slots, and one outside
// ReadSlotsMin..ReadSlotsMax is refused at Open.
func TestReadSlotsOption(t *testing.T) {
	s, err := Open(t.TempDir(), Options{ReadSlots: ReadSlotsMin + 3})
	if err != nil {
		t.Fatal(err)
	}
	if s.reads.n != ReadSlotsMin+3 {
		t.Errorf("%d read slots, want %d", s.reads.n, ReadSlotsMin+3)
	}
	s.Close()
	for _, n := range []int{ReadSlotsMin - 1, ReadSlotsMax + 1, -1} {
		if s, err := Open(t.TempDir(), Options{ReadSlots: n}); err == nil {
			s.Close()
			t.Errorf("Open with %d read slots: no error", n)
		} else if !strings.Contains(err.Error(), "read slots") {
			t.Errorf("Open with %d read slots: %v (does not name the read slots)", n, err)
		}
	}
}

// TestReadsWaitForASlot: a GET waits while every read slot is taken and a
// SCAN while fewer than ScanReadSlots are free, and each goes on when the
// slots it needs are given back: the bound is on the path every client
// read takes (a megabyte value pins a megabyte block per read in progress;
// 1,024 unbounded readers took a 192 MiB node to 346 MiB).
func TestReadsWaitForASlot(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	a.apply(1, put("k", "v"))
	bg := context.Background()
	for _, read := range []struct {
		name  string
		slots int64
		do    func() error
	}{
		{"GET", 1, func() error { _, _, err := s.Get(1, []byte("k")); return err }},
		{"SCAN", ScanReadSlots, func() error { _, _, err := s.Scan(1, nil, nil, 10); return err }},
	} {
		held := s.reads.n - read.slots + 1 // one short of what the read needs
		if err := s.reads.take(bg, 9, held); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- read.do() }()
		select {
		case err := <-done:
			t.Fatalf("%s ran with %d of %d read slots taken (err %v)", read.name, held, s.reads.n, err)
		case <-time.After(100 * time.Millisecond):
		}
		s.reads.give(1)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", read.name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not run once a slot was given back", read.name)
		}
		s.reads.give(held - 1)
	}
}

// TestReadSlotWaitEndsWithDeadline: with every slot taken, a GET and a
// SCAN whose context ends are answered UNAVAILABLE (retry later, not
// INTERNAL) without waiting on, and the slots are all there afterwards
// (the giving up took none).
func TestReadSlotWaitEndsWithDeadline(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	a.apply(1, put("k", "v"))
	bg := context.Background()
	if err := s.reads.take(bg, 9, s.reads.n); err != nil {
		t.Fatal(err)
	}
	for _, req := range []*proto.Request{
		{Op: proto.OpGet, Key: []byte("k")},
		{Op: proto.OpScan, Limit: 10},
	} {
		ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
		done := make(chan *proto.Response, 1)
		go func() { done <- s.ReadResponseWithin(ctx, 1, req, nil) }()
		select {
		case resp := <-done:
			if resp.Status != proto.StatusUnavailable || !strings.Contains(resp.Message, "read slot") {
				t.Errorf("%v with every slot taken and a 50 ms deadline: %v %q, want UNAVAILABLE naming the read slot", req.Op, resp.Status, resp.Message)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%v with every slot taken still waits 5 s past its 50 ms deadline", req.Op)
		}
		cancel()
	}
	s.reads.give(s.reads.n)
	if free := s.reads.freeSlots(); free != s.reads.n {
		t.Fatalf("reads that gave up kept slots: %d of %d free", free, s.reads.n)
	}
	if resp := s.ReadResponseWithin(bg, 1, &proto.Request{Op: proto.OpGet, Key: []byte("k")}, nil); resp.Status != proto.StatusOK {
		t.Fatalf("GET after the slots came back: %v %q", resp.Status, resp.Message)
	}
}

// TestReadSlotsFairBetweenTenants: with every slot held, tenant 1 queues
// 100 reads and then tenant 2 one; as slots are given back one at a time,
// tenant 2's read is among the first two granted (turns between tenants),
// tenant 1's in their arrival order, and every slot comes back at the end.
// Planted (one queue for all, testingReadSlotsFIFO): tenant 2's read is
// granted 101st.
func TestReadSlotsFairBetweenTenants(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		pos := readSlotsTurnOf(t, fifo)
		switch {
		case !fifo && pos > 2:
			t.Fatalf("tenant 2's read behind 100 of tenant 1's was granted %d-th", pos)
		case fifo && pos <= 2:
			t.Fatalf("planted FIFO: tenant 2's read granted %d-th; the test does not show the queue", pos)
		}
		t.Logf("fifo=%v: tenant 2's read granted %d-th", fifo, pos)
	}
}

func readSlotsTurnOf(t *testing.T, fifo bool) (pos int) {
	testingReadSlotsFIFO = fifo
	defer func() { testingReadSlotsFIFO = false }()
	r := newReadSlots(4)
	bg := context.Background()
	if err := r.take(bg, 1, 4); err != nil {
		t.Fatal(err)
	}
	const behind = 100
	granted := make(chan int, behind+1)
	queued := func(n int) {
		for deadline := time.Now().Add(5 * time.Second); ; {
			r.mu.Lock()
			waiting := 0
			for _, q := range r.queues {
				waiting += q.Len()
			}
			r.mu.Unlock()
			if waiting == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d reads waiting, want %d", waiting, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for i := 0; i < behind; i++ {
		go func() {
			if err := r.take(bg, 1, 1); err == nil {
				granted <- i
			}
		}()
		queued(i + 1) // in order
	}
	go func() {
		if err := r.take(bg, 2, 1); err == nil {
			granted <- -1
		}
	}()
	queued(behind + 1)
	last := -1
	for n := 1; n <= behind+1; n++ {
		r.give(1)
		switch g := <-granted; {
		case g == -1:
			pos = n
		case g < last:
			t.Fatalf("tenant 1's read %d granted after its read %d", g, last)
		default:
			last = g
		}
	}
	r.give(4) // what the granted reads hold (each of the 101 gives went to one)
	if free := r.freeSlots(); free != 4 {
		t.Fatalf("%d of 4 slots free at the end", free)
	}
	return pos
}

// TestReadSlotsUnderCancellation: many tenants' reads of 1 and 4 slots,
// a third of them with contexts that end while they wait, never hold more
// than there are, and leave every slot free.
func TestReadSlotsUnderCancellation(t *testing.T) {
	const slots = 6
	r := newReadSlots(slots)
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				w := int64(1)
				if i%5 == 0 {
					w = ScanReadSlots
				}
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if i%3 == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i%7)*50*time.Microsecond)
				}
				if err := r.take(ctx, tenants.ID(1+g%4), w); err == nil {
					n := held.Add(r.weight(w))
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					time.Sleep(time.Duration(i%3) * 20 * time.Microsecond)
					held.Add(-r.weight(w))
					r.give(w)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > slots {
		t.Fatalf("reads held %d slots at once, there are %d", p, slots)
	}
	if free := r.freeSlots(); free != slots {
		t.Fatalf("%d of %d slots free at the end", free, slots)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ring) != 0 || len(r.queues) != 0 {
		t.Fatalf("waiters left: ring %v, queues %d", r.ring, len(r.queues))
	}
}
