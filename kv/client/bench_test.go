package client

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
)

// BenchmarkLocalPut measures one client's Put round trip through the
// protocol, server and a single-node state machine on loopback.
func BenchmarkLocalPut(b *testing.B) {
	addr := startServer(b, localBackend(b))
	c, err := Dial(context.Background(), []string{addr}, token, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	val := make([]byte, 100)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.Put(context.Background(), []byte(fmt.Sprint(i%1000)), val); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLocalGetParallel measures pipelined Gets from many goroutines on
// one connection.
func BenchmarkLocalGetParallel(b *testing.B) {
	addr := startServer(b, localBackend(b))
	c, err := Dial(context.Background(), []string{addr}, token, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.Put(context.Background(), []byte("k"), make([]byte, 100))
	var errs atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Get(context.Background(), []byte("k")); err != nil {
				errs.Add(1)
			}
		}
	})
	if errs.Load() != 0 {
		b.Fatalf("%d gets failed", errs.Load())
	}
}
