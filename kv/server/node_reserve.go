package server

import "synod/kv/proto"

// The node's reserve. A tenant's response budget is a share of the
// node's (a quarter, by default and when kvnode derives them), so four
// tenants whose answers wait unread filled the node's budget, and every
// other tenant's large answers were THROTTLED until they were read (an
// outside tester: two flooding tenants at a half share THROTTLED a third's
// one-at-a-time reader). So the node's budget keeps a reserve that only a
// light tenant may take: one that holds at most tenantLightBytes once
// charged, two largest GET answers (one being written, the next read) and
// a few requests' reservations. Past that, a tenant charges only the
// shared part, which the flooding tenants fill between them. A SCAN whose
// reply may be larger than that (one of more than two megabytes of pairs)
// is not light: beside a flood it is THROTTLED as before.
//
// The node's request budget keeps the same reserve, for a tenant holding
// at most tenantLightRequestBytes of request bodies once charged: a
// tenant's request budget is half the node's, so two tenants pipelining
// megabyte writes filled it, and a third tenant's writes were THROTTLED
// at once (request_budget.go: the node's level does not wait).
//
// Contract (TestNodeReserveKeepsRoomForALightTenant,
// TestRequestReserveKeepsRoomForALightTenant): a charge takes the
// node's budget past its shared part only for a tenant that holds at most
// tenantLightBytes once charged. So each tenant holds at most that much of
// the reserve (a flooding tenant too, while it is light: its first
// answers, or when its kernel buffers drain), and a light tenant's answer
// that fits its connection's and tenant's budgets finds room while fewer
// than nodeReserveBytes/tenantLightBytes other tenants hold any of it.
const (
	// nodeReserveDivisor: the reserve is a quarter of the node's budget
	// (at least one light tenant's holding, and never so much that the
	// shared part holds less than that).
	nodeReserveDivisor = 4
	// tenantLightReservations is how many requests in flight a light
	// tenant's holding counts beside its answer.
	tenantLightReservations = 16
	// tenantLightBytes is the most a tenant may hold and still charge
	// the reserve: two largest GET answers (a reader's next answer is
	// charged before the writer gives its last one back) and
	// tenantLightReservations requests' reservations (2.1 MiB and
	// 64 KiB).
	tenantLightBytes = 2*(proto.HeaderBytes+64+proto.ValueBytesMax) + tenantLightReservations*responseBytesReserved
	// tenantLightRequestBytes is the most request body bytes a tenant may
	// hold and still charge the request budget's reserve: two of the
	// largest bodies (a writer's next request is read while its last one
	// commits).
	tenantLightRequestBytes = 2 * proto.RequestBodyBytesMax
)

// A light tenant can hold two answers of the largest value.
var _ [tenantLightBytes - responseBytesReserved - 2*(proto.HeaderBytes+64+proto.ValueBytesMax)]struct{}

// nodeReserveBytes is the reserve of a node budget of nodeMax bytes whose
// light tenants hold at most light bytes. Validate keeps the node's
// response budget at least ResponseBytesPerConnMin > tenantLightBytes, so
// its shared part always holds a light tenant's holding too; a request
// budget of fewer than two light holdings has no reserve.
func nodeReserveBytes(nodeMax, light int64) int64 {
	return max(0, min(max(nodeMax/nodeReserveDivisor, light), nodeMax-light))
}

// nodeLimitFor is how far a charge may take a node budget of nodeMax
// bytes for a tenant that holds tenantHeld bytes once charged: all of it
// for a light tenant (at most light bytes), the shared part for any other.
func nodeLimitFor(nodeMax, tenantHeld, light int64) int64 {
	if tenantHeld <= light {
		return nodeMax
	}
	return nodeMax - nodeReserveBytes(nodeMax, light)
}

// nodeLimit is nodeLimitFor the node's response budget and this
// connection's tenant as it holds now (a connection before HELLO has no
// tenant budget and charges nothing).
func (c *conn) nodeLimit() int64 {
	if c.tbudget == nil {
		return c.s.node.max
	}
	return nodeLimitFor(c.s.node.max, c.tbudget.used.Load(), tenantLightBytes)
}

// reqNodeLimit is nodeLimitFor the node's request budget and this
// connection's tenant as it holds now.
func (c *conn) reqNodeLimit() int64 {
	if c.reqTenant == nil {
		return c.s.reqNode.max
	}
	return nodeLimitFor(c.s.reqNode.max, c.reqTenant.used.Load(), tenantLightRequestBytes)
}
