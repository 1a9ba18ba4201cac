package load

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"synod/bench/hist"
)

// TestWireRoundTrip: a Result sent as JSON comes back with the same
// figures.
func TestWireRoundTrip(t *testing.T) {
	r := &Result{Hists: map[Key]*hist.Hist{}, Errors: map[Key]int64{}, ErrorKinds: map[string]int64{},
		Offered: 7, Done: 6, Shed: 1, Elapsed: time.Second, ScheduleLag: 3 * time.Millisecond}
	for i, d := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 90 * time.Millisecond} {
		r.hist(Key{Class: "write", Tenant: i % 2}).Record(d)
	}
	r.addErr(Key{Class: "write", Tenant: 1}, nil)
	b, err := json.Marshal(r.Wire())
	if err != nil {
		t.Fatal(err)
	}
	var w WireResult
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	got, err := FromWire(w)
	if err != nil {
		t.Fatal(err)
	}
	all := func(Key) bool { return true }
	if g, want := got.Merged(all).Summary(), r.Merged(all).Summary(); g != want {
		t.Fatalf("summary %+v, want %+v", g, want)
	}
	if got.ErrorsOf(all) != 1 || got.ErrorKinds["shed: never sent"] != 1 || got.Offered != 7 || got.Done != 6 ||
		got.Shed != 1 || got.Elapsed != time.Second || got.ScheduleLag != 3*time.Millisecond {
		t.Fatalf("counts %+v", got)
	}
}

// TestWireRefusesMalformed: what another process sent is checked, never
// trusted: each planted fault is refused with a reason.
func TestWireRefusesMalformed(t *testing.T) {
	good := func() WireResult {
		r := &Result{Hists: map[Key]*hist.Hist{}, Errors: map[Key]int64{}, ErrorKinds: map[string]int64{}}
		r.hist(Key{Class: "read"}).Record(time.Millisecond)
		r.addErr(Key{Class: "read"}, nil)
		return r.Wire()
	}
	if _, err := FromWire(good()); err != nil {
		t.Fatalf("the good one: %v", err)
	}
	for name, c := range map[string]struct {
		plant func(w *WireResult)
		want  string
	}{
		"short counts": {func(w *WireResult) {
			s := *w.Hists[0].Hist.Snapshot
			s.Counts = s.Counts[:10]
			w.Hists[0].Hist.Snapshot = &s
		}, "counts, want"},
		"other range": {func(w *WireResult) {
			s := *w.Hists[0].Hist.Snapshot
			s.HighestTrackableValue = 5
			w.Hists[0].Hist.Snapshot = &s
		}, "range"},
		"no counts": {func(w *WireResult) { w.Hists[0].Hist.Snapshot = nil }, "no counts"},
		"negative count": {func(w *WireResult) {
			s := *w.Hists[0].Hist.Snapshot
			s.Counts = append([]int64{-1}, s.Counts[1:]...)
			w.Hists[0].Hist.Snapshot = &s
		}, "negative"},
		"key twice":       {func(w *WireResult) { w.Hists = append(w.Hists, w.Hists[0]) }, "twice"},
		"negative offer":  {func(w *WireResult) { w.Offered = -1 }, "negative"},
		"negative errors": {func(w *WireResult) { w.Errors[0].N = -2 }, "negative"},
		"long kind":       {func(w *WireResult) { w.ErrorKinds[strings.Repeat("x", errorKindBytes+1)] = 1 }, "too long"},
	} {
		w := good()
		c.plant(&w)
		_, err := FromWire(w)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}
}
