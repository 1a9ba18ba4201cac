package client

import (
	"context"
	"sync/atomic"
	"testing"

	"synod/kv/proto"
	"synod/tenants"
)

// TestStatusFallsBackToBasic: a server from before the progress extension
// answers a STATUS with a body BAD_REQUEST; the client asks again with the
// basic request and returns that reply.
func TestStatusFallsBackToBasic(t *testing.T) {
	var asked, basic atomic.Int64
	addr := startServer(t, funcBackend(func(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
		if req.Op != proto.OpStatus {
			return &proto.Response{}
		}
		asked.Add(1)
		if req.StatusFormat != 0 {
			return proto.Errorf(proto.StatusBadRequest, "STATUS body: 1 trailing bytes")
		}
		basic.Add(1)
		return &proto.Response{Cluster: &proto.ClusterStatus{Self: 1, LeaderID: 1, Members: []proto.MemberStatus{{ID: 1, Role: proto.RoleLeader}}}}
	}))
	c := dial(t, []string{addr}, Options{})
	for name, status := range map[string]func(context.Context) (*proto.ClusterStatus, error){
		"Status":   c.Status,
		"StatusAt": func(ctx context.Context) (*proto.ClusterStatus, error) { return c.StatusAt(ctx, addr) },
	} {
		asked.Store(0)
		basic.Store(0)
		cs, err := status(context.Background())
		if err != nil || cs.Extended || len(cs.Members) != 1 || asked.Load() != 2 || basic.Load() != 1 {
			t.Fatalf("%s: %+v %v (asked %d, basic %d)", name, cs, err, asked.Load(), basic.Load())
		}
	}
}

// TestStatusExtended: against a server with the extension (kv/local), one
// request gets the extended reply.
func TestStatusExtended(t *testing.T) {
	c := dial(t, []string{startServer(t, localBackend(t))}, Options{})
	cs, err := c.Status(context.Background())
	if err != nil || !cs.Extended || cs.Members[0].Known&proto.KnownApplied == 0 {
		t.Fatalf("%+v %v", cs, err)
	}
}
