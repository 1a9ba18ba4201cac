package sm

import (
	"testing"
	"time"
)

// TestReadSlotsFor: the slots follow the cache (half of it in blocks of
// the largest value), within ReadSlotsMin..ReadSlotsMax, at each boundary.
func TestReadSlotsFor(t *testing.T) {
	per := int64(2 * readSlotBlockBytes) // cache bytes per slot
	for _, c := range []struct {
		cache int64
		want  int
	}{
		{0, ReadSlotsMin},
		{per*ReadSlotsMin - 1, ReadSlotsMin},
		{per * (ReadSlotsMin + 1), ReadSlotsMin + 1},
		{per*(ReadSlotsMin+1) - 1, ReadSlotsMin},
		{per * ReadSlotsMax, ReadSlotsMax},
		{per*ReadSlotsMax - 1, ReadSlotsMax - 1},
		{per * ReadSlotsMax * 4, ReadSlotsMax},
	} {
		if got := readSlotsFor(c.cache); got != c.want {
			t.Errorf("cache %d bytes: %d slots, want %d", c.cache, got, c.want)
		}
	}
}

// TestReadsWaitForASlot: a GET and a SCAN wait while every read slot is
// taken and go on when one is given back: the bound is on the path every
// client read takes (a megabyte value pins a megabyte block per read in
// progress; 1,024 unbounded readers took a 192 MiB node to 346 MiB).
func TestReadsWaitForASlot(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	a.apply(1, put("k", "v"))
	for _, read := range []struct {
		name string
		do   func() error
	}{
		{"GET", func() error { _, _, err := s.Get(1, []byte("k")); return err }},
		{"SCAN", func() error { _, _, err := s.Scan(1, nil, nil, 10); return err }},
	} {
		for range cap(s.reads) {
			s.reads.take()
		}
		done := make(chan error, 1)
		go func() { done <- read.do() }()
		select {
		case err := <-done:
			t.Fatalf("%s ran with every read slot taken (err %v)", read.name, err)
		case <-time.After(100 * time.Millisecond):
		}
		s.reads.give()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", read.name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not run once a slot was given back", read.name)
		}
		for range cap(s.reads) - 1 {
			s.reads.give()
		}
	}
}
