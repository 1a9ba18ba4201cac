package client

import (
	"context"
	"fmt"
	"runtime"
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

// BenchmarkLocalScanParallel measures SCANs of a thousand 100-byte pairs
// from 16 goroutines on one connection, and reports the pairs a SCAN
// returned on average (a thousand unless the response budgets shortened
// its page).
func BenchmarkLocalScanParallel(b *testing.B) { benchLocalScans(b, 1) }

// BenchmarkLocalScanConns is BenchmarkLocalScanParallel with each of the
// 16 goroutines on a connection of its own (one tenant): when a SCAN
// reserved its largest reply (3.15 MB) before it ran, 16 of them did not
// fit the tenant's 24 MiB and pages were shortened.
func BenchmarkLocalScanConns(b *testing.B) { benchLocalScans(b, 16) }

func benchLocalScans(b *testing.B, conns int) {
	const pairs = 1000
	addr := startServer(b, localBackend(b))
	var cs []*Client
	for range conns {
		c, err := Dial(context.Background(), []string{addr}, token, Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs = append(cs, c)
	}
	for i := range pairs {
		if err := cs[0].Put(context.Background(), []byte(fmt.Sprintf("k%04d", i)), make([]byte, 100)); err != nil {
			b.Fatal(err)
		}
	}
	var errs, got, next atomic.Int64
	b.SetParallelism(16 / max(1, runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := cs[int(next.Add(1))%len(cs)]
		for pb.Next() {
			kvs, _, err := c.Scan(context.Background(), nil, nil, pairs)
			if err != nil {
				errs.Add(1)
			}
			got.Add(int64(len(kvs)))
		}
	})
	b.ReportMetric(float64(got.Load())/float64(b.N), "pairs/scan")
	if errs.Load() != 0 {
		b.Fatalf("%d scans failed", errs.Load())
	}
}
