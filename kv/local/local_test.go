package local

import (
	"context"
	"testing"

	"synod/kv/proto"
	"synod/kv/sm"
)

func TestBackend(t *testing.T) {
	s, err := sm.Open(t.TempDir(), sm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := New(s, "127.0.0.1:1")
	ctx := context.Background()
	put := &proto.Request{Op: proto.OpPut, Tenant: 4, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("v")}
	if r := b.Do(ctx, 4, put); r.Status != proto.StatusOK {
		t.Fatalf("put: %v", r.Status)
	}
	if r := b.Do(ctx, 4, &proto.Request{Op: proto.OpGet, Tenant: 4, Key: []byte("k")}); r.Status != proto.StatusOK || string(r.Value) != "v" {
		t.Fatalf("get: %+v", r)
	}
	if r := b.Do(ctx, 5, &proto.Request{Op: proto.OpGet, Tenant: 5, Key: []byte("k")}); r.Status != proto.StatusNotFound {
		t.Fatalf("other tenant's get: %v", r.Status)
	}
	r := b.Do(ctx, 4, &proto.Request{Op: proto.OpStatus, Tenant: 4})
	if r.Cluster == nil || r.Cluster.LeaderAddr != "127.0.0.1:1" || r.Cluster.Members[0].Applied != 1 {
		t.Fatalf("status: %+v", r.Cluster)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if r := b.Do(cctx, 4, put); r.Status != proto.StatusUnavailable {
		t.Fatalf("cancelled ctx: %v", r.Status)
	}
}
