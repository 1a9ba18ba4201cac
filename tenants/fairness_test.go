package tenants

import (
	"fmt"
	"sort"
	"testing"
	"time"
)

// The fairness scenario, on a simulated clock: tenant "noisy" offers ten
// times its contract, tenant "victim" offers exactly its contract, and one
// proposer serves a fixed time per item.
const (
	contractOpsPerSec = 1000
	noisyOfferFactor  = 10
	serviceTime       = 400 * time.Microsecond // proposer capacity 2,500 ops/s
	simStep           = 50 * time.Microsecond
	simDuration       = 10 * time.Second
	// victimDelayBound is the queueing delay the victim must stay under:
	// a few service times, whatever the noisy tenant does.
	victimDelayBound = 5 * serviceTime
)

type fairMode int

const (
	modeShaperDRR fairMode = iota // shaper + DRR (the design)
	modeDRROnly                   // no shaper: DRR alone isolates
	modeFIFO                      // no shaper, one shared FIFO: the failure the design prevents
)

func (m fairMode) String() string {
	return [...]string{"shaper+drr", "drr-only", "fifo"}[m]
}

type fairResult struct {
	victimAdmitted, noisyAdmitted, victimOffered, noisyThrottled int
	victimDelays                                                 []time.Duration
}

func (r fairResult) victimRatio() float64 {
	return float64(r.victimAdmitted) / (contractOpsPerSec * simDuration.Seconds())
}

func (r fairResult) delayQuantile(q float64) time.Duration {
	if len(r.victimDelays) == 0 {
		return 0
	}
	d := append([]time.Duration(nil), r.victimDelays...)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

// fair is the property under test.
func (r fairResult) fair() bool {
	return r.victimRatio() >= 0.95 && r.delayQuantile(1) <= victimDelayBound
}

// fifo is the single shared queue of the failure mode.
type fifo struct {
	items []struct {
		id  ID
		enq time.Time
	}
	max int
}

func runFairness(t *testing.T, mode fairMode) fairResult {
	clk := newFakeClock()
	reg := testRegistry(t,
		Spec{ID: 1, Name: "noisy", OpsPerSec: contractOpsPerSec, OpsBurst: 20},
		Spec{ID: 2, Name: "victim", OpsPerSec: contractOpsPerSec, OpsBurst: 20},
	)
	shaper := NewShaper(reg, clk.Now, NewMetrics(reg))
	drr := NewDRR[time.Time](reg, DRRConfig{}, clk.Now, nil)
	shared := fifo{max: TenantQueueItemsMax}
	var res fairResult
	noisyEvery := time.Second / (contractOpsPerSec * noisyOfferFactor)
	victimEvery := time.Second / contractOpsPerSec
	var busyUntil time.Duration
	for el := time.Duration(0); el < simDuration; el += simStep {
		arrive := func(id ID) {
			if mode == modeShaperDRR {
				if ok, ra := shaper.Admit(id, 0, 100); !ok {
					if ra <= 0 {
						t.Fatalf("refused without a retry-after")
					}
					if id == 1 {
						res.noisyThrottled++
					}
					return
				}
			}
			var err error
			if mode == modeFIFO {
				if len(shared.items) == shared.max {
					err = ErrQueueFull
				} else {
					shared.items = append(shared.items, struct {
						id  ID
						enq time.Time
					}{id, clk.Now()})
				}
			} else {
				err = drr.Enqueue(id, 100, clk.Now())
			}
			switch {
			case err != nil && id == 1:
				res.noisyThrottled++
			case err == nil && id == 1:
				res.noisyAdmitted++
			case err == nil && id == 2:
				res.victimAdmitted++
			}
		}
		if el%noisyEvery == 0 {
			arrive(1)
		}
		if el%victimEvery == 0 {
			res.victimOffered++
			arrive(2)
		}
		if el >= busyUntil {
			var id ID
			var enq time.Time
			ok := false
			if mode == modeFIFO {
				if len(shared.items) > 0 {
					id, enq, ok = shared.items[0].id, shared.items[0].enq, true
					shared.items = shared.items[1:]
				}
			} else {
				enq, id, ok = drr.Dequeue()
			}
			if ok {
				busyUntil = el + serviceTime
				if id == 2 {
					res.victimDelays = append(res.victimDelays, clk.Now().Sub(enq))
				}
			}
		}
		clk.Advance(simStep)
	}
	return res
}

func TestFairnessNoisyNeighbor(t *testing.T) {
	for _, mode := range []fairMode{modeShaperDRR, modeDRROnly, modeFIFO} {
		r := runFairness(t, mode)
		fmt.Printf("tenants: fairness mode=%v victim_admitted=%.1f%% of contract victim_queue_p99=%v max=%v noisy_admitted=%d noisy_throttled=%d\n",
			mode, 100*r.victimRatio(), r.delayQuantile(0.99), r.delayQuantile(1), r.noisyAdmitted, r.noisyThrottled)
		switch mode {
		case modeShaperDRR, modeDRROnly:
			if !r.fair() {
				t.Errorf("%v: victim got %.1f%% of its contract, max queueing delay %v (bound %v)",
					mode, 100*r.victimRatio(), r.delayQuantile(1), victimDelayBound)
			}
			if mode == modeShaperDRR && r.noisyAdmitted > int(1.01*contractOpsPerSec*simDuration.Seconds())+20 {
				t.Errorf("noisy tenant admitted %d, above its contract", r.noisyAdmitted)
			}
		case modeFIFO:
			// The check must be able to fail: a shared FIFO lets the noisy
			// tenant's backlog delay the victim far past the bound.
			if r.fair() {
				t.Errorf("fifo passed the fairness check: the check cannot fail")
			}
		}
	}
}
