package main

import (
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress is the run's progress bar: one unit per phase, split into
// thousandths by the load generator's progress callback.
type progress struct {
	mu     sync.Mutex
	bar    *progressbar.ProgressBar
	done   int // whole phases done
	phases int
}

const progressUnitsPerPhase = 1000

func newProgress(phases int, quiet bool) *progress {
	p := &progress{phases: phases}
	if quiet {
		return p
	}
	p.bar = progressbar.NewOptions(phases*progressUnitsPerPhase,
		progressbar.OptionSetWriter(os.Stderr), progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionSetPredictTime(true),
		progressbar.OptionClearOnFinish())
	return p
}

func (p *progress) describe(s string) {
	if p == nil || p.bar == nil {
		return
	}
	p.bar.Describe(s)
}

// phase is load.Config.Progress: the fraction of the current phase.
func (p *progress) phase(frac float64) {
	if p == nil || p.bar == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bar.Set(p.done*progressUnitsPerPhase + int(frac*progressUnitsPerPhase))
	if frac >= 1 {
		p.done++
	}
}

// skip accounts for phases that will not run (a path that is n/a).
func (p *progress) skip(n int) {
	if p == nil || p.bar == nil {
		return
	}
	p.mu.Lock()
	p.done += n
	p.bar.Set(p.done * progressUnitsPerPhase)
	p.mu.Unlock()
}

func (p *progress) finish() {
	if p != nil && p.bar != nil {
		p.bar.Finish()
	}
}
