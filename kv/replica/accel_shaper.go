package replica

import (
	"errors"
	"fmt"
	"math"
	"time"

	"synod/accel"
	"synod/kv/proto"
	"synod/tenants"
)

// AccelAdmitter is the plane's per-tenant shaper as a client-server
// admitter (kv/server.Admitter): the token buckets live in the plane's
// tenant table (accel.Plane.Admit) instead of tenants.Shaper, with the same
// integer arithmetic (tenants.AdmitPair), so the two decide alike.
type AccelAdmitter struct {
	plane   *accel.Plane
	index   map[tenants.ID]int // registry id -> tenant-table entry; immutable
	metrics *tenants.Metrics
}

// ErrAccelOff is returned by AccelAdmitter when the replica runs without
// accel.
var ErrAccelOff = errors.New("replica: accel is off")

// planeRate converts a tenants.Spec rate or burst to the plane's integer
// per-second register (rounded up; 0 stays unlimited, as in tenants).
func planeRate(r float64) uint64 {
	if r <= 0 || math.IsNaN(r) {
		return 0
	}
	return uint64(math.Ceil(min(r, float64(tenants.RatePerSecMax))))
}

// AccelAdmitter loads every tenant of reg into the plane's tenant table and
// returns the admitter. metrics may be nil.
func (r *Replica) AccelAdmitter(reg *tenants.Registry, metrics *tenants.Metrics) (*AccelAdmitter, error) {
	if r.accel == nil {
		return nil, ErrAccelOff
	}
	a := r.accel
	specs := reg.All()
	if max := a.plane.Spec().TenantsMax; len(specs) > max {
		return nil, fmt.Errorf("replica: %d tenants exceed the plane's tenant table (%d)", len(specs), max)
	}
	ad := &AccelAdmitter{plane: a.plane, index: make(map[tenants.ID]int, len(specs)), metrics: metrics}
	a.mu.Lock()
	for i, sp := range specs {
		ad.index[sp.ID] = i
		a.buf = a.plane.SetTenant(a.buf, i, planeRate(sp.OpsPerSec), planeRate(sp.OpsBurst),
			planeRate(sp.BytesPerSec), planeRate(sp.BytesBurst))
	}
	a.flushLocked()
	a.mu.Unlock()
	return ad, nil
}

// Admit implements kv/server.Admitter: an unknown tenant is refused with
// retryAfter 0 (retrying will not help); a refused frame gets the plane's
// retry-after (at least one tick).
func (ad *AccelAdmitter) Admit(id tenants.ID, op proto.Opcode, frameBytes int) (bool, time.Duration) {
	_ = op // every opcode costs one op and its frame's bytes, as in tenants.Shaper
	i, ok := ad.index[id]
	if !ok {
		return false, 0
	}
	ok, wait := ad.plane.Admit(i, frameBytes)
	if ok {
		ad.metrics.Admitted(id, frameBytes)
		return true, 0
	}
	ad.metrics.Throttled(id, tenants.ThrottleRate)
	return false, time.Duration(max(wait, 1)) * accel.TickDuration
}
