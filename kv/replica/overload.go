package replica

import (
	"sync/atomic"
	"time"

	"synod/kv/proto"
	"synod/kv/server"
	"synod/tenants"
)

// Overload shedding. A tenant's contract (its token buckets) bounds what it
// may send, but contracts can add up to more than the node can commit, and
// a tenant's bulk contract may be set above capacity. Then queues grow,
// every request waits, the consensus loop and its heartbeats compete with
// client work for the CPU, and leaders change. The OverloadGuard sheds
// before that: in front of the tenant shaper it measures the node's own
// backlog (writes proposed or queued and not yet answered, plus reads
// waiting for a read index) and refuses new requests with THROTTLED,
// lowest priority first: bulk past overloadBulkBacklog, standard past
// overloadStandardBacklog, critical only past overloadCriticalBacklog (the
// bounded queues refuse beyond that anyway). Consensus traffic never passes
// through it: only client frames are shed.
const (
	overloadBulkBacklog     = 256
	overloadStandardBacklog = 1536
	overloadCriticalBacklog = 3072
	// overloadRetryAfterMin and overloadRetryAfterMax bound the retry-after
	// sent with a shed request (it grows with the backlog).
	overloadRetryAfterMin = 2 * time.Millisecond
	overloadRetryAfterMax = 100 * time.Millisecond
)

// OverloadGuard is a server.Admitter that sheds by priority when the
// replica's backlog grows, then defers to the inner admitter (the tenant
// shaper).
type OverloadGuard struct {
	r     *Replica
	reg   *tenants.Registry
	inner server.Admitter
	shed  [3]atomic.Uint64 // per priority class
}

var _ server.Admitter = (*OverloadGuard)(nil)

// NewOverloadGuard returns the guard of r in front of inner (nil: admit
// whatever the guard admits).
func NewOverloadGuard(r *Replica, reg *tenants.Registry, inner server.Admitter) *OverloadGuard {
	return &OverloadGuard{r: r, reg: reg, inner: inner}
}

// backlog is the replica's unanswered client work.
func (r *Replica) backlog() int {
	return int(r.inflightWrites.Load()) + len(r.readC)
}

// Admit implements server.Admitter.
func (g *OverloadGuard) Admit(tenant tenants.ID, op proto.Opcode, frameBytes int) (bool, time.Duration) {
	switch op {
	case proto.OpPut, proto.OpDelete, proto.OpCAS, proto.OpBatch, proto.OpGet, proto.OpScan:
		class := tenants.ClassStandard
		if spec, ok := g.reg.Get(tenant); ok {
			class = spec.Priority
		}
		limit := overloadStandardBacklog
		switch class {
		case tenants.ClassBulk:
			limit = overloadBulkBacklog
		case tenants.ClassCritical:
			limit = overloadCriticalBacklog
		}
		if b := g.r.backlog(); b >= limit {
			if int(class) < len(g.shed) {
				g.shed[class].Add(1)
			}
			g.r.metrics.Shed.WithLabelValues(classNames[min(int(class), len(classNames)-1)]).Inc()
			retry := time.Duration(b/limit) * overloadRetryAfterMin
			return false, min(max(retry, overloadRetryAfterMin), overloadRetryAfterMax)
		}
	}
	if g.inner == nil {
		return true, 0
	}
	return g.inner.Admit(tenant, op, frameBytes)
}

// Shed returns how many requests the guard refused, per priority class
// (critical, standard, bulk).
func (g *OverloadGuard) Shed() [3]uint64 {
	return [3]uint64{g.shed[0].Load(), g.shed[1].Load(), g.shed[2].Load()}
}

var classNames = [...]string{"critical", "standard", "bulk"}
