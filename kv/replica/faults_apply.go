package replica

import "time"

// ApplyDelayMax bounds one injected apply delay (DelayNextApply).
const ApplyDelayMax = time.Minute

// DelayNextApply makes the apply loop wait d before it applies its next
// committed entries, once: a state machine stalled on a full disk or a
// hung device, for drills and tests of the stuck-leader hand-over
// (stuck.go). d is clamped to [0, ApplyDelayMax]; a later call replaces a
// delay not yet taken.
func (f *Faults) DelayNextApply(d time.Duration) {
	f.applyDelay.Store(int64(min(max(d, 0), ApplyDelayMax)))
}

// ApplyDelayPending is the injected apply delay not yet taken (0: none).
func (f *Faults) ApplyDelayPending() time.Duration {
	if f == nil {
		return 0
	}
	return time.Duration(f.applyDelay.Load())
}

// applyDelay serves a fault-injected apply delay (apply loop).
func (r *Replica) applyDelay() {
	if r.faults == nil || r.faults.applyDelay.Load() == 0 || r.cfg.simulated {
		return
	}
	if d := time.Duration(r.faults.applyDelay.Swap(0)); d > 0 {
		r.log.Warn().Dur("delay", d).Msg("fault injection: delaying the apply loop")
		select {
		case <-time.After(d):
		case <-r.stop:
		}
	}
}
