package replica

import (
	"sync/atomic"
	"time"
)

// PersistDelayMax and ApplyDelayMax bound one injected delay
// (DelayNextPersist, DelayNextApply): drills, not a way to wedge a node.
const (
	PersistDelayMax = time.Minute
	ApplyDelayMax   = time.Minute
)

// oneShotDelay is an injected delay taken once by the first path that
// reaches it (0: none). Safe for concurrent use.
type oneShotDelay struct{ ns atomic.Int64 }

func (o *oneShotDelay) set(d, most time.Duration) { o.ns.Store(int64(min(max(d, 0), most))) }
func (o *oneShotDelay) pending() time.Duration    { return time.Duration(o.ns.Load()) }

// take returns the delay and clears it.
func (o *oneShotDelay) take() time.Duration {
	if o.ns.Load() == 0 {
		return 0
	}
	return time.Duration(o.ns.Swap(0))
}

// DelayNextPersist makes the next persist of the acceptor log (the
// leader's own writes on the persister, or a synchronous one on the
// consensus loop, whichever comes first) wait d before its barrier, once:
// a slow msync or a stalled disk, for drills and tests. d is clamped to
// [0, PersistDelayMax]; a later call replaces a delay not yet taken.
func (f *Faults) DelayNextPersist(d time.Duration) { f.persistDelay.set(d, PersistDelayMax) }

// PersistDelayPending is the injected persist delay not yet taken (0: none).
func (f *Faults) PersistDelayPending() time.Duration {
	if f == nil {
		return 0
	}
	return f.persistDelay.pending()
}

// takePersistDelay returns the injected persist delay and clears it.
func (f *Faults) takePersistDelay() time.Duration {
	if f == nil {
		return 0
	}
	return f.persistDelay.take()
}

// DelayNextApply makes the apply loop wait d before it applies its next
// committed entries, once: a state machine stalled on a full disk or a
// hung device, for drills and tests of the stuck-leader hand-over
// (stuck.go). d is clamped to [0, ApplyDelayMax]; a later call replaces a
// delay not yet taken.
func (f *Faults) DelayNextApply(d time.Duration) { f.applyDelay.set(d, ApplyDelayMax) }

// ApplyDelayPending is the injected apply delay not yet taken (0: none).
func (f *Faults) ApplyDelayPending() time.Duration {
	if f == nil {
		return 0
	}
	return f.applyDelay.pending()
}

// applyDelay serves a fault-injected apply delay (apply loop); the
// simulator has its own model of slow nodes and ignores it.
func (r *Replica) applyDelay() {
	if r.faults == nil || r.cfg.simulated {
		return
	}
	if d := r.faults.applyDelay.take(); d > 0 {
		r.log.Warn().Dur("delay", d).Msg("fault injection: delaying the apply loop")
		select {
		case <-time.After(d):
		case <-r.stop:
		}
	}
}
