package afxdp_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"synod/afxdp"
	"synod/afxdp/netns"
)

// needNetns skips (or fails, under CI=true) when namespaces cannot be
// built, then builds a fresh pair removed by t.Cleanup.
func needNetns(t *testing.T, subnet int) *netns.Pair {
	t.Helper()
	if err := netns.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true but %v", err)
		}
		t.Skip(err)
	}
	p, err := netns.NewPair(fmt.Sprintf("synod-xdp-%d-%d", os.Getpid(), subnet), subnet)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("cannot build namespaces: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("removing namespaces: %v", err)
		}
	})
	return p
}

// openXDP opens an XDPConn inside namespace ns; a missing kernel feature
// skips (fails under CI).
func openXDP(t *testing.T, ns string, cfg afxdp.Config) *afxdp.XDPConn {
	t.Helper()
	var c *afxdp.XDPConn
	err := netns.Run(ns, func() (err error) {
		c, err = afxdp.NewXDP(cfg)
		return err
	})
	if err != nil {
		if errors.Is(err, afxdp.ErrNotSupported) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func openUDP(t *testing.T, ns string, addr netip.AddrPort) *afxdp.UDPConn {
	t.Helper()
	var c *afxdp.UDPConn
	if err := netns.Run(ns, func() (err error) {
		c, err = afxdp.NewUDP(addr, afxdp.UDPOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readN reads until n datagrams arrived (or the deadline passes, closing
// the conn to unblock it) and returns their payloads and sources.
func readN(t *testing.T, c afxdp.Conn, n int, within time.Duration) ([]string, []netip.AddrPort) {
	t.Helper()
	timer := time.AfterFunc(within, func() { c.Close() })
	defer timer.Stop()
	pkts := make([]afxdp.Packet, c.BatchSize())
	for i := range pkts {
		pkts[i].Buf = make([]byte, 2048)
	}
	var payloads []string
	var from []netip.AddrPort
	for len(payloads) < n {
		k, err := c.ReadBatch(pkts)
		if err != nil {
			t.Fatalf("after %d of %d datagrams: %v", len(payloads), n, err)
		}
		for _, p := range pkts[:k] {
			payloads = append(payloads, string(p.Buf[:p.N]))
			from = append(from, p.Addr)
		}
	}
	return payloads, from
}

func sendAll(t *testing.T, c afxdp.Conn, to netip.AddrPort, prefix string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		b := []byte(fmt.Sprintf("%s-%04d", prefix, i))
		if k, err := c.WriteBatch([]afxdp.Packet{{Buf: b, N: len(b), Addr: to}}); k != 1 || err != nil {
			t.Fatalf("WriteBatch to %v = %d, %v", to, k, err)
		}
	}
}

// TestXDPReceiveTransmit runs an XDPConn in namespace a against a kernel
// UDP socket in namespace b, in each attach mode and address family.
func TestXDPReceiveTransmit(t *testing.T) {
	for i, tc := range []struct {
		attach string
		v6     bool
	}{
		{afxdp.AttachNative, false},
		{afxdp.AttachGeneric, false},
		{afxdp.AttachNative, true},
		{afxdp.AttachGeneric, true},
	} {
		t.Run(fmt.Sprintf("%s/v6=%v", tc.attach, tc.v6), func(t *testing.T) {
			p := needNetns(t, 10+i)
			addrA, addrB := p.Addr4[0], p.Addr4[1]
			if tc.v6 {
				addrA, addrB = p.Addr6[0], p.Addr6[1]
			}
			const port = 7400
			x := openXDP(t, p.NS[0], afxdp.Config{
				Interface: p.If[0], Addr: addrA, Port: port, Attach: tc.attach,
				FrameCount: 1024, // 512 receive frames: room for the 200-datagram burst
			})
			if x.AttachMode() != tc.attach {
				t.Fatalf("attached %q, want %q", x.AttachMode(), tc.attach)
			}
			peer := openUDP(t, p.NS[1], netip.AddrPortFrom(addrB, port))
			const n = 200
			sendAll(t, peer, x.LocalAddr(), "to-xdp", n)
			got, from := readN(t, x, n, 10*time.Second)
			for i := range got {
				if want := fmt.Sprintf("to-xdp-%04d", i); got[i] != want || from[i] != peer.LocalAddr() {
					t.Fatalf("xdp got %q from %v, want %q from %v", got[i], from[i], want, peer.LocalAddr())
				}
			}
			// The first reply may go through the kernel (neighbour not yet
			// learned); the rest leave through the TX ring.
			sendAll(t, x, peer.LocalAddr(), "to-kernel", n)
			got, from = readN(t, peer, n, 10*time.Second)
			for i := range got {
				if want := fmt.Sprintf("to-kernel-%04d", i); got[i] != want || from[i] != x.LocalAddr() {
					t.Fatalf("kernel got %q from %v, want %q from %v", got[i], from[i], want, x.LocalAddr())
				}
			}
			st := x.Stats()
			if st.RxPackets != n || st.TxPackets != n || st.RxBadChecksum != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestKernelStillAnswers checks that with the XDP program attached, the
// kernel in namespace a still answers ARP and ping, and another UDP port
// still reaches a kernel socket.
func TestKernelStillAnswers(t *testing.T) {
	for i, attach := range []string{afxdp.AttachNative, afxdp.AttachGeneric} {
		t.Run(attach, func(t *testing.T) {
			p := needNetns(t, 20+i)
			x := openXDP(t, p.NS[0], afxdp.Config{Interface: p.If[0], Port: 7400, Attach: attach, FrameCount: 256})
			other := openUDP(t, p.NS[0], netip.AddrPortFrom(p.Addr4[0], 7401))
			// Fresh namespaces: b has no neighbour entry for a, so this ping
			// needs ARP through the XDP program too.
			for _, dst := range []netip.Addr{p.Addr4[0], p.Addr6[0]} {
				if err := netns.Ping(p.NS[1], dst, 5*time.Second); err != nil {
					t.Fatalf("through XDP: %v", err)
				}
			}
			peer := openUDP(t, p.NS[1], netip.AddrPortFrom(p.Addr4[1], 7402))
			sendAll(t, peer, other.LocalAddr(), "other-port", 5)
			got, _ := readN(t, other, 5, 10*time.Second)
			if got[4] != "other-port-0004" {
				t.Fatalf("other port got %q", got)
			}
			if st := x.Stats(); st.RxPackets != 0 || st.RxForeign != 0 {
				t.Fatalf("the XDP socket saw traffic not for it: %+v", st)
			}
		})
	}
}

// TestXDPSoak ping-pongs datagrams between two XDPConns (adaptive poll,
// native attach) with a bounded window of outstanding requests and checks
// every one is answered exactly once, in order.
func TestXDPSoak(t *testing.T) {
	total := 100_000
	if testing.Short() {
		total = 10_000
	}
	const window = 32
	p := needNetns(t, 30)
	const port = 7400
	srv := openXDP(t, p.NS[0], afxdp.Config{Interface: p.If[0], Port: port, Attach: afxdp.AttachNative})
	cli := openXDP(t, p.NS[1], afxdp.Config{Interface: p.If[1], Port: port, Attach: afxdp.AttachNative})

	var echoed atomic.Int64
	go func() {
		pkts := make([]afxdp.Packet, srv.BatchSize())
		for i := range pkts {
			pkts[i].Buf = make([]byte, 2048)
		}
		for {
			n, err := srv.ReadBatch(pkts)
			if err != nil {
				return
			}
			if _, err := srv.WriteBatch(pkts[:n]); err != nil {
				return
			}
			echoed.Add(int64(n))
		}
	}()

	// A stall watchdog: if no reply arrives for 5s, the rest is lost.
	var progress atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		last := int64(-1)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Second):
			}
			if cur := progress.Load(); cur == last {
				cli.Close()
				return
			} else {
				last = cur
			}
		}
	}()

	rx := make([]afxdp.Packet, cli.BatchSize())
	for i := range rx {
		rx[i].Buf = make([]byte, 2048)
	}
	tx := make([]afxdp.Packet, window)
	bufs := make([][64]byte, window)
	next, received := 0, 0
	lost := 0
	for received < total {
		k := 0
		for next < total && next-received < window && k < window {
			binary.BigEndian.PutUint64(bufs[k][:], uint64(next))
			tx[k] = afxdp.Packet{Buf: bufs[k][:], N: 64, Addr: srv.LocalAddr()}
			k++
			next++
		}
		if k > 0 {
			if n, err := cli.WriteBatch(tx[:k]); n != k || err != nil {
				t.Fatalf("WriteBatch = %d of %d, %v", n, k, err)
			}
		}
		n, err := cli.ReadBatch(rx)
		if err != nil {
			lost = total - received
			break
		}
		for _, pk := range rx[:n] {
			if pk.N != 64 || binary.BigEndian.Uint64(pk.Buf) != uint64(received) {
				t.Fatalf("reply %d: got seq %d (n=%d)", received, binary.BigEndian.Uint64(pk.Buf), pk.N)
			}
			received++
		}
		progress.Store(int64(received))
	}
	fmt.Printf("afxdp soak: packets=%d lost=%d\n", received, lost)
	if lost != 0 {
		t.Fatalf("lost %d of %d; client %+v server %+v", lost, total, cli.Stats(), srv.Stats())
	}
	if st := srv.Stats(); st.RxBadChecksum+st.RxRunt+st.RxTruncated+st.RxForeign != 0 {
		t.Fatalf("server dropped frames: %+v", st)
	}
}
