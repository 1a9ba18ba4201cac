package e2e

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"synod/kv/client"
	"synod/kv/proto"
	"synod/tenants"
)

// TestCrossTenantIsolation: tenant A's token cannot read or write tenant
// B's keys, whether through the client library (same key names land in
// separate keyspaces) or with a hand-made frame that claims B's tenant id
// on a connection authenticated as A.
func TestCrossTenantIsolation(t *testing.T) {
	c := newCluster(t, 3)
	a := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer a.Close()
	b := dialClient(t, c.endpoints(), tenantB.token, killClientRetries)
	defer b.Close()
	if a.Tenant() != tenants.ID(tenantA.id) || b.Tenant() != tenants.ID(tenantB.id) {
		t.Fatalf("tokens authenticated tenants %d and %d", a.Tenant(), b.Tenant())
	}
	ctx, cancel := ctxTimeout(killOpTimeout)
	defer cancel()
	if err := a.Put(ctx, []byte("shared"), []byte("from-a")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, []byte("shared")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("tenant B sees tenant A's key: %v", err)
	}
	if err := b.Put(ctx, []byte("shared"), []byte("from-b")); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, []byte("shared")); err != nil {
		t.Fatal(err)
	}
	if v, err := a.Get(ctx, []byte("shared")); err != nil || string(v) != "from-a" {
		t.Fatalf("tenant A's key after B wrote and deleted its own: %q %v", v, err)
	}
	pairs, _, err := b.Scan(ctx, nil, nil, 100)
	if err != nil || len(pairs) != 0 {
		t.Fatalf("tenant B's scan sees %d pairs (%v)", len(pairs), err)
	}

	// A bad token is refused.
	if _, err := client.Dial(ctx, c.endpoints(), "not-a-real-token", client.Options{RetriesMax: 1}); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("bad token: %v", err)
	}

	// Forged tenant id: authenticate as A, then send a GET claiming B.
	l := c.leader()
	conn, err := net.DialTimeout("tcp", l.client, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	if _, err := conn.Write(proto.AppendRequest(nil, &proto.Request{Op: proto.OpHello, ID: 1, Version: proto.Version, Token: tenantA.token})); err != nil {
		t.Fatal(err)
	}
	if resp := readResponse(t, r); resp.Status != proto.StatusOK || resp.Tenant != tenants.ID(tenantA.id) {
		t.Fatalf("hello: %+v", resp)
	}
	if _, err := conn.Write(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, ID: 2, Tenant: tenants.ID(tenantB.id), Key: []byte("shared")})); err != nil {
		t.Fatal(err)
	}
	resp := readResponse(t, r)
	if resp.Status != proto.StatusUnauthorized || len(resp.Value) != 0 {
		t.Fatalf("forged tenant id: status %v value %q, want UNAUTHORIZED", resp.Status, resp.Value)
	}
}

func readResponse(t *testing.T, r *bufio.Reader) *proto.Response {
	t.Helper()
	hdr := make([]byte, proto.HeaderBytes)
	if _, err := io.ReadFull(r, hdr); err != nil {
		t.Fatalf("reading response header: %v", err)
	}
	h, err := proto.DecodeHeader(hdr)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, h.Length)
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatalf("reading response body: %v", err)
	}
	resp, err := proto.DecodeResponse(h, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestTenantThrottled: a tenant over its ops budget gets THROTTLED with a
// retry-after, decided from the frame header, while another tenant is
// served.
func TestTenantThrottled(t *testing.T) {
	c := newCluster(t, 3)
	l := c.leader()
	conn, err := net.DialTimeout("tcp", l.client, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	if _, err := conn.Write(proto.AppendRequest(nil, &proto.Request{Op: proto.OpHello, ID: 1, Version: proto.Version, Token: tenantC.token})); err != nil {
		t.Fatal(err)
	}
	if resp := readResponse(t, r); resp.Status != proto.StatusOK {
		t.Fatalf("hello: %v", resp.Status)
	}
	// Twenty pipelined GETs against a burst of five.
	const n = 20
	var frames []byte
	for i := 0; i < n; i++ {
		frames = proto.AppendRequest(frames, &proto.Request{Op: proto.OpGet, ID: uint64(10 + i), Tenant: tenants.ID(tenantC.id), Key: []byte("k")})
	}
	if _, err := conn.Write(frames); err != nil {
		t.Fatal(err)
	}
	throttled := 0
	for i := 0; i < n; i++ {
		resp := readResponse(t, r)
		switch resp.Status {
		case proto.StatusThrottled:
			throttled++
			if resp.RetryAfter <= 0 {
				t.Fatalf("THROTTLED without a retry-after")
			}
		case proto.StatusOK, proto.StatusNotFound:
		default:
			t.Fatalf("unexpected status %v", resp.Status)
		}
	}
	if throttled == 0 {
		t.Fatalf("a tenant with a burst of 5 sent %d requests at once and none was throttled", n)
	}
	// Tenant A is not affected.
	a := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer a.Close()
	ctx, cancel := ctxTimeout(killOpTimeout)
	defer cancel()
	for i := 0; i < n; i++ {
		if err := a.Put(ctx, []byte("a"), []byte("1")); err != nil {
			t.Fatalf("tenant A: %v", err)
		}
	}
	t.Logf("tenant C: %d of %d throttled", throttled, n)
}
