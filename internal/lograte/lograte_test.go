package lograte

import (
	"sync"
	"testing"
	"time"
)

// TestLimiterOnePerPeriod: the first event passes, then one per Every by
// the times given, each with the count held back before it.
func TestLimiterOnePerPeriod(t *testing.T) {
	l := Limiter{Every: time.Second}
	t0 := time.Unix(100, 0)
	steps := []struct {
		at   time.Duration
		ok   bool
		held uint64
	}{
		{0, true, 0},
		{time.Millisecond, false, 0},
		{999 * time.Millisecond, false, 0},
		{time.Second, true, 2}, // exactly Every after the last line
		{1500 * time.Millisecond, false, 0},
		{10 * time.Second, true, 1},
		{10 * time.Second, false, 0}, // the same instant again
	}
	for i, s := range steps {
		ok, held := l.Allow(t0.Add(s.at))
		if ok != s.ok || held != s.held {
			t.Fatalf("step %d at %v: ok=%v held=%d, want ok=%v held=%d", i, s.at, ok, held, s.ok, s.held)
		}
	}
}

// TestLimiterZeroEvery: without a period every event passes.
func TestLimiterZeroEvery(t *testing.T) {
	var l Limiter
	now := time.Unix(5, 0)
	for i := range 3 {
		if ok, held := l.Allow(now); !ok || held != 0 {
			t.Fatalf("event %d: ok=%v held=%d", i, ok, held)
		}
	}
}

// TestLimiterConcurrent: under concurrent callers at one instant exactly
// one passes, and the next line's count holds every other event.
func TestLimiterConcurrent(t *testing.T) {
	l := Limiter{Every: time.Minute}
	now := time.Unix(7, 0)
	const callers = 64
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := 0
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ok, _ := l.Allow(now); ok {
				mu.Lock()
				passed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if passed != 1 {
		t.Fatalf("%d of %d concurrent events passed, want 1", passed, callers)
	}
	if ok, held := l.Allow(now.Add(time.Minute)); !ok || held != callers-1 {
		t.Fatalf("next period: ok=%v held=%d, want true %d", ok, held, callers-1)
	}
}
