package hist

import (
	"fmt"

	hdr "github.com/HdrHistogram/hdrhistogram-go"
)

// Wire is a histogram as it crosses a process boundary (kvbench runs the
// overload scenario's victims in a process of their own): its HDR counts
// and how many values were clamped. It encodes to JSON.
type Wire struct {
	Snapshot *hdr.Snapshot `json:"hdr"`
	Clamped  int64         `json:"clamped,omitempty"`
}

// Wire returns x's counts.
func (x *Hist) Wire() Wire {
	x.mu.Lock()
	defer x.mu.Unlock()
	return Wire{Snapshot: x.h.Export(), Clamped: x.clamped}
}

// FromWire returns the histogram w holds. It checks what another process
// sent: the same range and precision as New, and as many counts, none
// negative (hdr.Import would index past its counts on a short array).
func FromWire(w Wire) (*Hist, error) {
	s := w.Snapshot
	if s == nil {
		return nil, fmt.Errorf("hist: no counts")
	}
	if s.LowestTrackableValue != LowestMicros || s.HighestTrackableValue != HighestMicros || s.SignificantFigures != SignificantFigs {
		return nil, fmt.Errorf("hist: range %d..%d at %d figures, want %d..%d at %d",
			s.LowestTrackableValue, s.HighestTrackableValue, s.SignificantFigures, LowestMicros, HighestMicros, SignificantFigs)
	}
	x := New()
	if want := len(x.h.Export().Counts); len(s.Counts) != want {
		return nil, fmt.Errorf("hist: %d counts, want %d", len(s.Counts), want)
	}
	for _, c := range s.Counts {
		if c < 0 {
			return nil, fmt.Errorf("hist: a negative count")
		}
	}
	if w.Clamped < 0 {
		return nil, fmt.Errorf("hist: a negative clamped count")
	}
	x.h = hdr.Import(s)
	x.clamped = w.Clamped
	return x, nil
}
