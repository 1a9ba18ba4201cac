package replica

import "time"

// PersistDelayMax bounds one injected persist delay (DelayNextPersist): a
// drill, not a way to wedge a node.
const PersistDelayMax = time.Minute

// DelayNextPersist makes the next persist of the acceptor log (the
// leader's own writes on the persister, or a synchronous one on the
// consensus loop, whichever comes first) wait d before its barrier, once:
// a slow msync or a stalled disk, for drills and tests. d is clamped to
// [0, PersistDelayMax]; a later call replaces a delay not yet taken.
func (f *Faults) DelayNextPersist(d time.Duration) {
	f.persistDelay.Store(int64(min(max(d, 0), PersistDelayMax)))
}

// PersistDelayPending is the injected delay not yet taken (0: none).
func (f *Faults) PersistDelayPending() time.Duration {
	if f == nil {
		return 0
	}
	return time.Duration(f.persistDelay.Load())
}

// takePersistDelay returns the injected delay and clears it.
func (f *Faults) takePersistDelay() time.Duration {
	if f == nil || f.persistDelay.Load() == 0 {
		return 0
	}
	return time.Duration(f.persistDelay.Swap(0))
}
