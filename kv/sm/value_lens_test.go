package sm

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"synod/kv/proto"
)

// TestRememberedLengthRefusesWithoutReading: a GET of a large value whose
// answer has no room is refused with the value's remembered length without
// reading the store (value_lens.go): it is refused while the store cannot
// be read at all, where a GET the table does not cover fails reading. The
// refusal still takes a read slot in turn (ReadRefusal: bounded, it cannot
// make thousands of goroutines runnable at once): with every slot held by
// another tenant it waits. A write replaces the length, a small value is
// forgotten, and a GET admitted by its room still reads the store and is
// charged what it read.
func TestRememberedLengthRefusesWithoutReading(t *testing.T) {
	s := openT(t, t.TempDir())
	defer s.Close()
	a := newApplier(t, s)
	big := strings.Repeat("b", 200<<10)
	a.apply(1, put("big", big))
	a.apply(1, put("small", "s"))

	var asked []int
	refuse := proto.Errorf(proto.StatusThrottled, "no room")
	room := func(limit int) func(int) *proto.Response {
		return func(n int) *proto.Response {
			asked = append(asked, n)
			if n > limit {
				return refuse
			}
			return nil
		}
	}
	req := func(key string) *proto.Request { return &proto.Request{Op: proto.OpGet, Key: []byte(key)} }
	get := func(ctx context.Context, key string, limit int) *proto.Response {
		asked = nil
		return s.ReadResponseWithin(ctx, 1, req(key), room(limit))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// The store unreadable: the remembered value is refused all the same.
	s.dbMu.Lock()
	s.dbClosed = true
	s.dbMu.Unlock()
	if r := get(ctx, "big", 1000); r != refuse || len(asked) != 1 || asked[0] != len(big) {
		t.Fatalf("GET of the remembered value, no room, the store unreadable: %v, room asked %v; want the refusal, asked once with %d", r.Status, asked, len(big))
	}
	if r := s.ReadRefusal(ctx, 1, req("big"), room(1000)); r != refuse {
		t.Fatalf("ReadRefusal of the remembered value: %v", r)
	}
	if r := get(ctx, "small", 1000); r.Status != proto.StatusInternal {
		t.Fatalf("GET of a value not remembered, the store unreadable: %v; want INTERNAL (it read)", r.Status)
	}
	if r := s.ReadRefusal(ctx, 1, req("small"), room(1000)); r != nil {
		t.Fatalf("ReadRefusal of a value not remembered: %v, want nil", r)
	}
	s.dbMu.Lock()
	s.dbClosed = false
	s.dbMu.Unlock()

	// Every read slot held by tenant 2: the refusal waits for its turn.
	if err := s.reads.take(context.Background(), 2, s.reads.n); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	if r := get(short, "big", 1000); r.Status != proto.StatusUnavailable || len(asked) != 0 {
		t.Fatalf("a refusal while every read slot is held: %v, room asked %v; want UNAVAILABLE after waiting for a slot", r.Status, asked)
	}
	if r := s.ReadRefusal(short, 1, req("big"), room(1000)); r != nil {
		t.Fatalf("ReadRefusal while every read slot is held: %v; want nil once its ctx ended", r)
	}
	s.reads.give(s.reads.n)

	// Admitted: read, and charged the length read.
	if r := get(ctx, "big", 1<<20); r.Status != proto.StatusOK || string(r.Value) != big || len(asked) != 2 {
		t.Fatalf("GET admitted by its room: %v, %d bytes, room asked %v; want the value, asked twice", r.Status, len(r.Value), asked)
	}
	// Replaced by a small value: forgotten, served.
	a.apply(1, put("big", "now small"))
	if r := get(ctx, "big", 1000); r.Status != proto.StatusOK || string(r.Value) != "now small" || len(asked) != 1 {
		t.Fatalf("GET after the value shrank: %v %q, room asked %v", r.Status, r.Value, asked)
	}
	// Deleted: forgotten.
	a.apply(1, put("big", big))
	a.apply(1, &proto.Request{Op: proto.OpDelete, Key: []byte("big")})
	if r := get(ctx, "big", 1000); r.Status != proto.StatusNotFound {
		t.Fatalf("GET after delete: %v, room asked %v", r.Status, asked)
	}
}

// TestValueLensRecordsOnlyCurrentReads: a read that began before a slot
// was applied does not record the length it read (it may be the value the
// slot replaced); lengths below the minimum are not kept; the table stays
// within valueLensMax; reset (a swapped-in state) forgets everything.
func TestValueLensRecordsOnlyCurrentReads(t *testing.T) {
	var v valueLens
	key := []byte("k")
	gen := v.generation()
	v.applied(map[string]int{"other": 1})
	v.record(key, valueLenRememberedBytesMin, gen)
	if _, ok := v.lookup(key); ok {
		t.Fatal("a read from before an applied slot recorded its length")
	}
	v.record(key, valueLenRememberedBytesMin-1, v.generation())
	if _, ok := v.lookup(key); ok {
		t.Fatal("a length under the minimum was recorded")
	}
	v.record(key, valueLenRememberedBytesMin, v.generation())
	if n, ok := v.lookup(key); !ok || n != valueLenRememberedBytesMin {
		t.Fatalf("a current read's length: %d %v", n, ok)
	}
	for i := range 3 * valueLensMax {
		v.applied(map[string]int{string(rune(i)) + "x": valueLenRememberedBytesMin + i})
	}
	if len(v.lens) > valueLensMax {
		t.Fatalf("%d lengths remembered, bound %d", len(v.lens), valueLensMax)
	}
	v.reset()
	if len(v.lens) != 0 {
		t.Fatalf("%d lengths after reset", len(v.lens))
	}
}

// TestRestoreForgetsRememberedLengths: a snapshot restored over the state
// forgets the lengths of the values it replaced.
func TestRestoreForgetsRememberedLengths(t *testing.T) {
	src := openT(t, t.TempDir())
	defer src.Close()
	newApplier(t, src).apply(1, put("k", "small in the snapshot"))
	stream, _ := snapshotBytes(t, src)
	dst := openT(t, t.TempDir())
	defer dst.Close()
	newApplier(t, dst).apply(1, put("k", strings.Repeat("b", 200<<10)))
	if err := dst.Restore(bytes.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	r := dst.ReadResponseWithin(context.Background(), 1, &proto.Request{Op: proto.OpGet, Key: []byte("k")}, func(n int) *proto.Response {
		if n > 1000 {
			return proto.Errorf(proto.StatusThrottled, "no room for %d", n)
		}
		return nil
	})
	if r.Status != proto.StatusOK || string(r.Value) != "small in the snapshot" {
		t.Fatalf("GET after restore: %v %q (refused for the replaced value's length?)", r.Status, r.Value)
	}
}
