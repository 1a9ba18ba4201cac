package resp

import (
	"sync"
	"testing"

	"synod/kv/client"
	"synod/tenants"
)

// TestProxyOneClientPerTenant: concurrent first commands of a tenant get
// the same client, made without dialling (it dials on its first request,
// once per member however many requests wait), not a client each.
func TestProxyOneClientPerTenant(t *testing.T) {
	p := newProxy([]string{"127.0.0.1:1", "127.0.0.1:2"}, nil)
	defer p.close()
	spec := tenants.Spec{ID: 7, Name: "t", Token: "proxy-test-token"}
	const callers = 64
	got := make([]*client.Client, callers)
	var wg sync.WaitGroup
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := p.client(spec, "127.0.0.1:3")
			if err != nil {
				t.Error(err)
			}
			got[i] = cl
		}()
	}
	wg.Wait()
	for i, cl := range got {
		if cl == nil || cl != got[0] {
			t.Fatalf("caller %d got client %p, caller 0 %p", i, cl, got[0])
		}
	}
	if len(p.clients) != 1 {
		t.Fatalf("%d clients for one tenant", len(p.clients))
	}
	p.close()
	if _, err := p.client(spec, ""); err == nil {
		t.Fatal("a closed proxy handed out a client")
	}
}
