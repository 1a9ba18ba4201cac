package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/rs/zerolog"

	"synod/kv/client"
	"synod/kv/local"
	"synod/kv/server"
	"synod/kv/sm"
	"synod/tenants"
)

// Example runs a single-node store (kv/local behind kv/server) on loopback
// and uses it through the client.
func Example() {
	dir, _ := os.MkdirTemp("", "synod-example")
	defer os.RemoveAll(dir)
	store, err := sm.Open(dir, sm.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	reg, _ := tenants.NewRegistry([]tenants.Spec{{ID: 1, Name: "shop", Token: "shop-secret-token"}})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := server.New(server.Config{}, reg, local.New(store, ln.Addr().String()), zerolog.Nop())
	go srv.Serve(ln)
	defer srv.Close()

	ctx := context.Background()
	c, err := client.Dial(ctx, []string{ln.Addr().String()}, "shop-secret-token", client.Options{})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	c.Put(ctx, []byte("cart/42"), []byte("3 apples"))
	v, _ := c.Get(ctx, []byte("cart/42"))
	fmt.Printf("get: %s\n", v)

	err = c.CAS(ctx, []byte("cart/42"), []byte("2 apples"), []byte("4 apples"))
	fmt.Println("stale CAS is a mismatch:", errors.Is(err, client.ErrCASMismatch))

	c.Delete(ctx, []byte("cart/42"))
	_, err = c.Get(ctx, []byte("cart/42"))
	fmt.Println("after delete:", errors.Is(err, client.ErrNotFound))
	// Output:
	// get: 3 apples
	// stale CAS is a mismatch: true
	// after delete: true
}
