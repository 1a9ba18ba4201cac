package replica

import (
	"testing"
	"time"

	"synod/kv/proto"
	"synod/tenants"
)

// TestOverloadGuardShedsLowestPriorityFirst walks each class's backlog
// threshold: below it the request goes on to the inner admitter, at it the
// request is THROTTLED with a retry-after within bounds; bulk goes first,
// critical last; consensus traffic never passes through the guard.
func TestOverloadGuardShedsLowestPriorityFirst(t *testing.T) {
	reg, err := tenants.NewRegistry([]tenants.Spec{
		{ID: 1, Name: "crit", Token: "token-critical-1", Priority: tenants.ClassCritical},
		{ID: 2, Name: "std", Token: "token-standard-2", Priority: tenants.ClassStandard},
		{ID: 3, Name: "bulk", Token: "token-bulk-0003", Priority: tenants.ClassBulk},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &Replica{metrics: NewMetrics(nil), readC: make(chan *readWaiter, 1)}
	g := NewOverloadGuard(r, reg, nil)
	admitted := func(tenant tenants.ID, backlog int) bool {
		r.inflightWrites.Store(int64(backlog))
		ok, retry := g.Admit(tenant, proto.OpPut, 100)
		if !ok && (retry < overloadRetryAfterMin || retry > overloadRetryAfterMax) {
			t.Fatalf("retry-after %v outside [%v, %v]", retry, overloadRetryAfterMin, overloadRetryAfterMax)
		}
		return ok
	}
	for _, tc := range []struct {
		tenant tenants.ID
		limit  int
	}{{3, overloadBulkBacklog}, {2, overloadStandardBacklog}, {1, overloadCriticalBacklog}} {
		if !admitted(tc.tenant, tc.limit-1) {
			t.Errorf("tenant %d refused one below its threshold %d", tc.tenant, tc.limit)
		}
		if admitted(tc.tenant, tc.limit) {
			t.Errorf("tenant %d admitted at its threshold %d", tc.tenant, tc.limit)
		}
	}
	if !admitted(1, overloadStandardBacklog) || admitted(3, overloadStandardBacklog) {
		t.Error("at the standard threshold a critical tenant must pass and a bulk one be shed")
	}
	if shed := g.Shed(); shed[2] == 0 || shed[1] == 0 || shed[0] == 0 {
		t.Errorf("shed counts %v", shed)
	}
	r.inflightWrites.Store(overloadCriticalBacklog * 10)
	if _, retry := g.Admit(3, proto.OpGet, 10); retry != overloadRetryAfterMax {
		t.Errorf("retry-after at a huge backlog %v, want the cap %v", retry, overloadRetryAfterMax)
	}
	if ok, _ := g.Admit(3, proto.OpPing, 10); !ok {
		t.Error("a PING was shed (it costs the node nothing)")
	}
	_ = time.Millisecond
}
