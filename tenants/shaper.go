package tenants

import (
	"sync"
	"time"
)

// Shaper admits client frames per tenant on the fixed frame header, before
// the body is decoded or anything reaches Pebble or Paxos: one ops bucket
// and one bytes bucket per tenant, refilled from an injected clock, with
// the integer arithmetic of AdmitPair (the same rule the accel plane's
// shaper table and the RTL implement).
//
// It has the shape of kv/server's Admitter; the runtime adapts it with a
// one-line wrapper (op is passed through as a byte so this package needs no
// import of kv/proto):
//
//	type admitter struct{ s *tenants.Shaper }
//	func (a admitter) Admit(t tenants.ID, op proto.Opcode, n int) (bool, time.Duration) {
//		return a.s.Admit(t, uint8(op), n)
//	}
//
// Safe for concurrent use; tenants never contend with each other (one lock
// per tenant).
type Shaper struct {
	now     func() time.Time
	epoch   time.Time
	tenants map[ID]*shaped // fixed at NewShaper: read-only afterwards
	metrics *Metrics
}

type shaped struct {
	mu         sync.Mutex
	ops, bytes Bucket
}

// NewShaper builds buckets for every tenant in reg, full, as of now().
// metrics may be nil.
func NewShaper(reg *Registry, now func() time.Time, metrics *Metrics) *Shaper {
	s := &Shaper{now: now, epoch: now(), tenants: map[ID]*shaped{}, metrics: metrics}
	for _, sp := range reg.All() {
		t := &shaped{}
		t.ops.SetRate(ratePerSec(sp.OpsPerSec), ratePerSec(sp.OpsBurst), 0)
		t.bytes.SetRate(ratePerSec(sp.BytesPerSec), ratePerSec(sp.BytesBurst), 0)
		s.tenants[sp.ID] = t
	}
	return s
}

// nowMicros is the shaper's clock: microseconds since NewShaper, never
// negative.
func (s *Shaper) nowMicros() uint64 {
	d := s.now().Sub(s.epoch)
	if d < 0 {
		return 0
	}
	return uint64(d / time.Microsecond)
}

// Admit decides on one frame of frameBytes for tenant id. Every opcode
// costs one op and its frame's bytes (op is accepted for the Admitter
// shape and future per-op costs). Refused: retryAfter is when both buckets
// will hold the frame's cost (at least 1µs); the server answers THROTTLED
// with it. An unknown tenant is refused with retryAfter 0: retrying will
// not help.
func (s *Shaper) Admit(id ID, op uint8, frameBytes int) (ok bool, retryAfter time.Duration) {
	_ = op
	t := s.tenants[id]
	if t == nil {
		return false, 0
	}
	n := uint64(max(frameBytes, 0))
	now := s.nowMicros()
	t.mu.Lock()
	ok, wait := AdmitPair(&t.ops, &t.bytes, n, now)
	t.mu.Unlock()
	if ok {
		s.metrics.Admitted(id, frameBytes)
		return true, 0
	}
	s.metrics.Throttled(id, ThrottleRate)
	return false, time.Duration(max(wait, 1)) * time.Microsecond
}
