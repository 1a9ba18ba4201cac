package pmem

import (
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// Persist does not hold the log while its barrier runs: an Append (and
// Usage, Promised, SetPromised) completes while a slow persist is stuck in
// its msync; the persist makes durable what was appended before it began,
// a later Persist what came after; Close waits for the one in progress.
// Reopening finds every record in append order.
func TestAppendWhilePersistRuns(t *testing.T) {
	dir := shmDir(t)
	path := filepath.Join(dir, "log")
	l, _ := mustOpen(t, testOpts(path, RegionBytesMin))
	rec := func(slot uint64) []Record {
		return []Record{{Type: RecordEntry, Slot: slot, Ballot: Ballot{Round: 1, Node: 1}, Payload: pattern(slot, 1, 100)}}
	}
	if err := l.Append(rec(1)); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	// The first ring flush (not a meta update) waits inside its barrier
	// until release; later ones pass. (It once offered itself only if the
	// test was already waiting: a persist that reached its barrier first
	// went through, and the test waited on entered for ever.)
	var held atomic.Bool
	persistHook = func(r *region, off, n int64) {
		if off >= headerBytes && held.CompareAndSwap(false, true) {
			entered <- struct{}{}
			<-release
		}
	}
	defer func() { persistHook = nil }()
	done := make(chan error, 1)
	go func() { done <- l.Persist() }()
	select {
	case <-entered: // the first persist is inside its barrier
	case <-time.After(10 * time.Second):
		t.Fatal("the first Persist never reached its barrier")
	}
	appended := make(chan error, 1)
	go func() {
		err := l.Append(rec(2))
		if err == nil {
			err = l.SetPromised(Ballot{Round: 2, Node: 1})
		}
		appended <- err
	}()
	select {
	case err := <-appended:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Append and SetPromised waited behind a persist barrier")
	}
	second := make(chan error, 1)
	go func() { second <- l.Persist() }()
	select {
	case <-second:
		t.Fatal("a second Persist did not wait for the first one's barrier")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	persistHook = nil
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, _ = mustOpen(t, testOpts(path, 0))
	defer l.Close()
	var slots []uint64
	if err := l.Iterate(0, func(r Record) error { slots = append(slots, r.Slot); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(slots) != 2 || slots[0] != 1 || slots[1] != 2 {
		t.Fatalf("recovered slots %v, want [1 2]", slots)
	}
	if p := l.Promised(); p != (Ballot{Round: 2, Node: 1}) {
		t.Fatalf("promised %v", p)
	}
}

// Close waits for a persist in progress instead of unmapping the region
// under it.
func TestCloseWaitsForPersist(t *testing.T) {
	dir := shmDir(t)
	l, _ := mustOpen(t, testOpts(filepath.Join(dir, "log"), RegionBytesMin))
	if err := l.Append([]Record{{Type: RecordEntry, Slot: 1, Payload: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool // the first ring flush waits, as above
	persistHook = func(r *region, off, n int64) {
		if off >= headerBytes && held.CompareAndSwap(false, true) {
			entered <- struct{}{}
			<-release
		}
	}
	defer func() { persistHook = nil }()
	done := make(chan error, 1)
	go func() { done <- l.Persist() }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the Persist never reached its barrier")
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned while a persist barrier was running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
