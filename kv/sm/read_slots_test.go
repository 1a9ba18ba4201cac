package sm

import (
	"context"
	"strings"
	"testing"
	"time"

	"synod/kv/proto"
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
		if err := s.reads.take(bg, held); err != nil {
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
	if err := s.reads.take(bg, s.reads.n); err != nil {
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
	if !s.reads.sem.TryAcquire(s.reads.n) {
		t.Fatal("reads that gave up kept slots")
	}
	s.reads.sem.Release(s.reads.n)
	if resp := s.ReadResponseWithin(bg, 1, &proto.Request{Op: proto.OpGet, Key: []byte("k")}, nil); resp.Status != proto.StatusOK {
		t.Fatalf("GET after the slots came back: %v %q", resp.Status, resp.Message)
	}
}
