package stall

import (
	"fmt"
	"io"
	"runtime/trace"
	"sync"
	"time"
)

// recorder is the process's one FlightRecorder, shared by every detector
// that wants one (the runtime allows one at a time).
type recorder struct {
	fr *trace.FlightRecorder
	// writeMu serializes snapshots: FlightRecorder.WriteTo refuses a
	// second concurrent call.
	writeMu sync.Mutex
}

// shared holds the process's recorder and how many detectors use it.
var shared struct {
	mu   sync.Mutex
	rec  *recorder
	refs int
}

// acquireRecorder returns the process's recorder, starting it with the
// given window when no detector holds it.
func acquireRecorder(window time.Duration, maxBytes uint64) (*recorder, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.rec == nil {
		fr := trace.NewFlightRecorder(trace.FlightRecorderConfig{MinAge: window, MaxBytes: maxBytes})
		if err := fr.Start(); err != nil {
			return nil, fmt.Errorf("starting the flight recorder: %w", err)
		}
		shared.rec = &recorder{fr: fr}
	}
	shared.refs++
	return shared.rec, nil
}

// release drops one detector's hold; the last one stops the recorder.
func (r *recorder) release() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.refs--
	if shared.refs == 0 && shared.rec == r {
		r.writeMu.Lock() // no snapshot in progress
		r.fr.Stop()
		r.writeMu.Unlock()
		shared.rec = nil
	}
}

// writeTo snapshots the window to w.
func (r *recorder) writeTo(w io.Writer) (int64, error) {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	return r.fr.WriteTo(w)
}
