package main

import (
	"bufio"
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

// rawAdminRequest sends a request by hand on a new connection to addr and
// returns the connection and its reader.
func rawAdminRequest(t *testing.T, addr, req string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

// TestAdminDropsUnsentBodies: a request without the token that announces
// a body it never sends is answered 401 at once and its connection
// closed: the server used to read the body first, so an outside tester's
// requests held their connections for good, and then, with a read
// timeout, for 10 s each, enough to hold every place at adminConnsMax.
// With the token, such a request's connection is closed within
// adminReadTimeout (20,000 of them took every descriptor of the node).
func TestAdminDropsUnsentBodies(t *testing.T) {
	addr, _ := startAdmin(t, adminConnsMax)
	c, br := rawAdminRequest(t, addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer within 3 s to an unauthenticated request announcing a body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", resp.StatusCode)
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatalf("the connection was still open 3 s after its request: %v", err)
	}

	c, br = rawAdminRequest(t, addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+testAdminToken+"\r\nContent-Length: 100\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(adminReadTimeout + 5*time.Second))
	start := time.Now()
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break // closed (EOF) or the deadline (checked below)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("an authenticated request's unsent body held its connection %v (adminReadTimeout %v): %v", time.Since(start), adminReadTimeout, err)
	}
}

// TestAdminConnectionsCapped: however many connections strangers open and
// leave silent, at most the cap are held at once, and an operator's
// connection arriving among them is served at once, taking the place of
// the oldest stranger's; connections proven by the token keep their
// places, and a stranger arriving when every place is proven is closed.
func TestAdminConnectionsCapped(t *testing.T) {
	const connsMax = 4
	addr, capped := startAdmin(t, connsMax)
	var strangers []net.Conn
	defer func() {
		for _, c := range strangers {
			c.Close()
		}
	}()
	for range 3 * connsMax {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		strangers = append(strangers, c)
	}
	time.Sleep(200 * time.Millisecond)
	if n := capped.open(); n > connsMax {
		t.Fatalf("%d admin connections held at once, want at most %d", n, connsMax)
	}
	// Operators, one by one among the strangers: each is served at once
	// and keeps its connection (proven).
	var operators []net.Conn
	for i := range connsMax {
		c, br := rawAdminRequest(t, addr, "GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+testAdminToken+"\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("operator %d among %d silent strangers was not served within 3 s: %v", i, len(strangers), err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("operator %d: %d", i, resp.StatusCode)
		}
		operators = append(operators, c)
		// a stranger arrives after each operator
		if s, err := net.Dial("tcp", addr); err == nil {
			strangers = append(strangers, s)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if ev := capped.evicted.Load(); ev == 0 {
		t.Fatal("no stranger's connection was evicted for an operator's")
	}
	// Every place is proven now: the last stranger was refused, and each
	// operator's connection still answers.
	if rf := capped.refused.Load(); rf == 0 {
		t.Fatal("a stranger arriving with every place proven was not refused")
	}
	for i, c := range operators {
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatalf("operator %d lost its connection: %v", i, err)
		}
	}
	t.Logf("held %d, evicted %d, refused %d", capped.open(), capped.evicted.Load(), capped.refused.Load())
}

// TestAdminStrangerLosesPlacesFirst: at the cap, a stranger's
// connections from one address are evicted before an operator's from
// another, however many more the stranger opens while the operator's
// request is on its way. Planted with the first version's choice (the
// oldest unproven connection, whatever its address), the operator's is
// evicted.
func TestAdminStrangerLosesPlacesFirst(t *testing.T) {
	run := func() error {
		const connsMax = 4
		addr, _ := startAdmin(t, connsMax)
		dialFrom := func(ip string) net.Conn {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
			c, err := d.Dial("tcp", addr)
			if err != nil {
				t.Fatalf("cannot dial from %s (a loopback address other than 127.0.0.1): %v", ip, err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		for range connsMax {
			dialFrom("127.0.0.2")
		}
		op := dialFrom("127.0.0.3") // silent for now: unproven
		time.Sleep(100 * time.Millisecond)
		for range 3 * connsMax {
			dialFrom("127.0.0.2")
		}
		time.Sleep(200 * time.Millisecond)
		op.SetDeadline(time.Now().Add(3 * time.Second))
		io.WriteString(op, "GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+testAdminToken+"\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(op), nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	if err := run(); err != nil {
		t.Fatalf("the operator's connection was evicted for a stranger's from another address: %v", err)
	}
	testingEvictIgnoresSource.Store(true)
	defer testingEvictIgnoresSource.Store(false)
	if err := run(); err == nil {
		t.Fatal("planted (evicting the oldest whatever its address): the operator was still served; the test does not tell")
	}
}
