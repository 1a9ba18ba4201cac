package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// startAdmin serves the token-protected admin handler of a solo replica
// the way listenAdmin does, with a cap of connsMax, and returns the
// address and the capped listener.
func startAdmin(t *testing.T, connsMax int) (string, *cappedListener) {
	t.Helper()
	r := newSoloReplica(t)
	cfg := &Config{AdminListen: "0.0.0.0:7021", Admin: AdminConfig{Token: testAdminToken}}
	if err := cfg.validateAdmin(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	capped := newCappedListener(ln, connsMax)
	srv := newAdminServer(cfg.adminHandler(adminMux(r, prometheus.NewRegistry(), r.Faults(), true), zerolog.Nop()))
	go srv.Serve(capped)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), capped
}

// TestAdminDropsUnsentBodies: a request without the token that announces
// a body it never sends is answered 401 at once, and its connection is
// closed within adminReadTimeout: it used to stay open for good (the
// server waits for the body before reusing the connection), and an
// outside tester's 20,000 of them took every descriptor of the node.
func TestAdminDropsUnsentBodies(t *testing.T) {
	addr, _ := startAdmin(t, adminConnsMax)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(adminReadTimeout + 5*time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", resp.StatusCode)
	}
	start := time.Now()
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatalf("the connection was still open %v after the 401 (adminReadTimeout %v): %v", time.Since(start), adminReadTimeout, err)
	}
}

// TestAdminConnectionsCapped: however many connections a sender opens, at
// most the cap are accepted at once; the rest wait in the kernel's queue
// and are served, in turn, as the ones before them close.
func TestAdminConnectionsCapped(t *testing.T) {
	const connsMax = 4
	addr, capped := startAdmin(t, connsMax)
	var held []net.Conn
	for range 3 * connsMax {
		c, err := net.Dial("tcp", addr) // the kernel completes the handshake; the server may not accept
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	time.Sleep(200 * time.Millisecond) // let the server accept what it will
	if n := capped.open(); n > connsMax {
		t.Fatalf("%d admin connections accepted at once, want at most %d", n, connsMax)
	}
	// The last one is served once the ones ahead of it close.
	last := held[len(held)-1]
	for _, c := range held[:len(held)-1] {
		c.Close()
	}
	last.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(last, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(last), nil)
	if err != nil {
		t.Fatalf("a queued connection was never served after the others closed: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz on the queued connection: %d", resp.StatusCode)
	}
	last.Close()
}
