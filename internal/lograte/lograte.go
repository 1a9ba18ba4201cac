// Package lograte bounds repeated log lines: at most one line per period
// for one kind of event, with the count of the events left out since the
// line before.
//
// Every event that can repeat at the rate of outside input (refused
// packets, refused connections, failing disk writes, a node that keeps
// deferring its elections) logs through a Limiter: an outside tester's
// connection flood once wrote 7,295 lines, and Pebble retrying a flush on
// a full disk 13,394 lines in 90 s. One line a period says the same, and
// its count says how much was left out.
package lograte

import (
	"sync"
	"time"
)

// Limiter lets the first event through, then at most one per Every, and
// counts the events it held back in between. The zero value with Every set
// is ready; Every <= 0 lets every event through. Safe for concurrent use.
type Limiter struct {
	Every time.Duration

	mu     sync.Mutex
	next   time.Time // the earliest time the next line may be logged
	primed bool      // an event was let through
	held   uint64    // events held back since the last one let through
}

// Allow reports whether the event at now may be logged and, when it may,
// how many events were held back since the last one that was (0 when it
// may not). Events let through are at least Every apart, by the times
// passed to Allow.
func (l *Limiter) Allow(now time.Time) (ok bool, held uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.primed && now.Before(l.next) {
		l.held++
		return false, 0
	}
	l.primed, l.next = true, now.Add(l.Every)
	held, l.held = l.held, 0
	return true, held
}
