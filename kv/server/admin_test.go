package server

import (
	"testing"

	"synod/kv/proto"
)

// TestMemberOpsNeedTheAdminToken: a membership operation reaches the
// backend only with the node's admin token; without one configured, with
// a tenant token, or with a wrong one it is answered UNAUTHORIZED and the
// connection stays open. Other requests are not affected.
func TestMemberOpsNeedTheAdminToken(t *testing.T) {
	const admin = "admin-token-0123456789abcdef"
	list := func(id uint64, token string) []byte {
		return proto.AppendRequest(nil, &proto.Request{Op: proto.OpMemberList, Tenant: 1, ID: id, AdminToken: token})
	}
	for _, c := range []struct {
		name   string
		config string // the server's admin token
		token  string // the request's
		want   proto.Status
	}{
		{"no admin token configured", "", admin, proto.StatusUnauthorized},
		{"a tenant token", admin, tokenA, proto.StatusUnauthorized},
		{"a wrong token", admin, admin + "x", proto.StatusUnauthorized},
		{"the admin token", admin, admin, proto.StatusOK},
	} {
		_, addr := start(t, &echoBackend{}, Config{AdminToken: c.config})
		rc := dialRaw(t, addr)
		rc.hello(tokenA)
		rc.send(list(2, c.token))
		if r := rc.mustRecv(); r.Status != c.want || r.ID != 2 || r.Op != proto.OpMemberList {
			t.Fatalf("%s: %v %q (id %d), want %v", c.name, r.Status, r.Message, r.ID, c.want)
		}
		// The connection is still open.
		rc.send(proto.AppendRequest(nil, &proto.Request{Op: proto.OpPing, Tenant: 1, ID: 3}))
		if r := rc.mustRecv(); r.Status != proto.StatusOK || r.ID != 3 {
			t.Fatalf("%s: ping after the member request: %v", c.name, r.Status)
		}
	}
}
