package server

import (
	"time"

	"synod/kv/proto"
)

// The node's reserve. A tenant's response budget is a share of the
// node's (a quarter, by default and when kvnode derives them), so four
// tenants whose answers wait unread filled the node's budget, and every
// other tenant's large answers were THROTTLED until they were read (an
// outside tester: two flooding tenants at a half share THROTTLED a third's
// one-at-a-time reader). So the node's budget keeps a reserve that only a
// light tenant may take: one that holds at most tenantLightBytes once
// charged (two largest GET answers, one being written and the next read,
// and a few requests' reservations) and has not held more for
// tenantHeavyMemory (counted from the last moment it held more). Past
// that, a tenant charges only the shared part, which the flooding tenants
// fill between them. A SCAN is charged pair by pair (value_room.go): one
// whose pairs pass that bound beside a flood ends its page at the first
// pair with no room (More set), and is THROTTLED only when that is its
// first.
//
// The memory is what keeps flooders out of the reserve: without it a
// flooding tenant was light again whenever its connections were closed
// (write_timeout) and opened again, or the kernel's buffers took its
// answers, and six such tenants each held part of the reserve in unread
// answers until a reader found no room (the second outside check of the
// reserve: 56 and 69 THROTTLED GETs in two runs). A tenant that never held
// more than tenantLightBytes, as a client reading its answers does, is
// never affected by it.
//
// The node's request budget keeps the same reserve, for a tenant holding
// at most tenantLightRequestBytes of request bodies: a tenant's request
// budget is half the node's, so two tenants pipelining megabyte writes
// filled it, and a third tenant's writes were THROTTLED at once
// (request_budget.go: the node's level does not wait).
//
// Contract (TestNodeReserveKeepsRoomForALightTenant,
// TestRequestReserveKeepsRoomForALightTenant,
// TestNodeReserveRemembersHeavyTenants): a charge takes a node budget
// past its shared part only for a tenant that holds at most the light
// bound once charged and held no more within tenantHeavyMemory. So a
// tenant holds at most the light bound of the reserve, and only if it was
// light throughout the last tenantHeavyMemory (a flooder only in its
// first moments): a light tenant's answer that fits its connection's and
// tenant's budgets finds room while fewer than nodeReserveBytes/light
// other tenants hold any of the reserve.
const (
	// nodeReserveDivisor: the reserve is at least a quarter of the node's
	// budget...
	nodeReserveDivisor = 4
	// nodeReserveLightTenants: ... and room for this many light tenants'
	// holdings, within half the node's budget (a 192 MiB node's 23 MiB
	// response budget keeps 8.2 MiB; the default 96 MiB keeps 24).
	nodeReserveLightTenants = 4
	// tenantLightReservations is how many requests in flight a light
	// tenant's holding counts beside its answers.
	tenantLightReservations = 16
	// tenantLightBytes is the most a tenant may hold and still charge
	// the reserve: two largest GET answers as the server bounds them
	// before it sends them (getAnswerOverheadBytes around the value; a reader's
	// next answer is charged before the writer gives its last one back)
	// and tenantLightReservations requests' reservations: 2,160,508
	// bytes, 2.06 MiB.
	tenantLightBytes = 2*(getAnswerOverheadBytes+proto.ValueBytesMax) + tenantLightReservations*responseBytesReserved
	// tenantLightRequestBytes is the most request body bytes a tenant may
	// hold and still charge the request budget's reserve: two of the
	// largest bodies (a writer's next request is read while its last one
	// commits).
	tenantLightRequestBytes = 2 * proto.RequestBodyBytesMax
	// tenantHeavyMemory is how long a tenant that held more than the
	// light bound is kept out of the reserve: write_timeout's default,
	// how long unread answers stay before their connection is closed.
	tenantHeavyMemory = WriteTimeoutDefault
)

// A light tenant can hold two answers of the largest value.
var _ [tenantLightBytes - responseBytesReserved - 2*(getAnswerOverheadBytes+proto.ValueBytesMax)]struct{}

// nodeReserveBytes is the reserve of a node budget of nodeMax bytes whose
// light tenants hold at most light bytes: a quarter of it, or
// nodeReserveLightTenants light holdings, within half of it, and never so
// much that the shared part holds less than one light holding. Validate
// keeps the node's response budget at least ResponseBytesPerConnMin >
// tenantLightBytes; a request budget of less than one light holding has
// no reserve.
func nodeReserveBytes(nodeMax, light int64) int64 {
	r := min(max(nodeMax/nodeReserveDivisor, nodeReserveLightTenants*light), nodeMax/2)
	return max(0, min(r, nodeMax-light))
}

// nodeLimitFor is how far a charge may take a node budget of nodeMax
// bytes for a tenant: all of it for a light tenant, the shared part for
// any other.
func nodeLimitFor(nodeMax, light int64, isLight bool) int64 {
	if isLight {
		return nodeMax
	}
	return nodeMax - nodeReserveBytes(nodeMax, light)
}

// lightNow reports whether a tenant whose budget is tb, holding held
// bytes once charged, is light: at most light bytes, and no more within
// tenantHeavyMemory before now. It remembers nothing: only a charge that
// succeeds (noteHeavy after it) or a release marks a tenant heavy, so a
// refused reservation (a SCAN of three megabyte values beside a flood)
// does not keep its tenant out of the reserve (an outside tester: its
// 2-in-flight reader got 0 of 91 answers for 10 s after such a SCAN).
func lightNow(tb *budget, held, light int64, now func() time.Time) bool {
	if held > light {
		return false
	}
	at := tb.heavyAt.Load()
	return at == 0 || now().UnixNano()-at >= int64(tenantHeavyMemory)
}

// noteHeavy records that the tenant whose budget is tb holds more than
// light now: after each charge that succeeded, and before each release,
// so the memory runs from the last moment it held more, not from its last
// charge (a flooder whose charges all fail at its own budget charges
// nothing for the 10 s before write_timeout closes its connections, and
// was light again at once when they reopened).
func (s *Server) noteHeavy(tb *budget, light int64) {
	if tb != nil && tb.used.Load() > light {
		tb.heavyAt.Store(s.clock()().UnixNano())
	}
}

// clock is the server's clock (time.Now unless a test set one).
func (s *Server) clock() func() time.Time {
	if s.now != nil {
		return s.now
	}
	return time.Now
}

// nodeLimit is how far a charge may take the node's response budget for
// this connection's tenant as it holds now (a connection before HELLO has
// no tenant budget and charges nothing).
func (c *conn) nodeLimit() int64 {
	if c.tbudget == nil {
		return c.s.node.max
	}
	return nodeLimitFor(c.s.node.max, tenantLightBytes, lightNow(c.tbudget, c.tbudget.used.Load(), tenantLightBytes, c.s.clock()))
}

// reqNodeLimit is nodeLimit for the node's request budget.
func (c *conn) reqNodeLimit() int64 {
	if c.reqTenant == nil {
		return c.s.reqNode.max
	}
	return nodeLimitFor(c.s.reqNode.max, tenantLightRequestBytes, lightNow(c.reqTenant, c.reqTenant.used.Load(), tenantLightRequestBytes, c.s.clock()))
}
