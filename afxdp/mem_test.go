package afxdp

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func pkt(payload string, to netip.AddrPort) Packet {
	return Packet{Buf: []byte(payload), N: len(payload), Addr: to}
}

func readOne(t *testing.T, c Conn) Packet {
	t.Helper()
	pkts := []Packet{{Buf: make([]byte, 2048)}}
	n, err := c.ReadBatch(pkts)
	if err != nil || n != 1 {
		t.Fatalf("ReadBatch = %d, %v", n, err)
	}
	return pkts[0]
}

func TestMemNetworkDeliversAndPartitions(t *testing.T) {
	net := NewMemNetwork()
	a, b, c := ap("10.0.0.1:7000"), ap("10.0.0.2:7000"), ap("10.0.0.3:7000")
	ca, cb, cc := net.Listen(a), net.Listen(b), net.Listen(c)
	defer ca.Close()
	defer cb.Close()
	defer cc.Close()

	if n, err := ca.WriteBatch([]Packet{pkt("hello", b)}); n != 1 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	p := readOne(t, cb)
	if string(p.Buf[:p.N]) != "hello" || p.Addr != a {
		t.Fatalf("got %q from %v", p.Buf[:p.N], p.Addr)
	}

	net.Partition(a, b)
	ca.WriteBatch([]Packet{pkt("lost", b), pkt("to-c", c)})
	cb.WriteBatch([]Packet{pkt("lost-too", a)})
	if p := readOne(t, cc); string(p.Buf[:p.N]) != "to-c" {
		t.Fatalf("c got %q", p.Buf[:p.N])
	}
	net.Heal(a, b)
	ca.WriteBatch([]Packet{pkt("after-heal", b)})
	if p := readOne(t, cb); string(p.Buf[:p.N]) != "after-heal" {
		t.Fatalf("b got %q; a partitioned datagram leaked", p.Buf[:p.N])
	}

	net.Isolate(c)
	ca.WriteBatch([]Packet{pkt("x", c)})
	net.Rejoin(c)
	net.SetDropFunc(func(from, to netip.AddrPort, payload []byte) bool { return string(payload) == "drop-me" })
	ca.WriteBatch([]Packet{pkt("drop-me", c), pkt("keep", c)})
	if p := readOne(t, cc); string(p.Buf[:p.N]) != "keep" {
		t.Fatalf("c got %q", p.Buf[:p.N])
	}
	delivered, dropped := net.Stats()
	if delivered != 4 || dropped != 4 {
		t.Fatalf("stats delivered=%d dropped=%d, want 4 and 4", delivered, dropped)
	}
}

func TestMemConnCloseUnblocksAndRelisten(t *testing.T) {
	net := NewMemNetwork()
	a := ap("[fd00::1]:9")
	c := net.Listen(a)
	errc := make(chan error, 1)
	go func() {
		_, err := c.ReadBatch([]Packet{{Buf: make([]byte, 8)}})
		errc <- err
	}()
	c2 := net.Listen(a) // a restarted node takes the address over
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("blocked read returned %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("re-Listen did not close the old conn")
	}
	if _, err := c.WriteBatch([]Packet{pkt("x", a)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	if n, err := c2.WriteBatch([]Packet{pkt(string(make([]byte, memPayloadBytesMax+1)), a)}); n != 0 || !errors.Is(err, ErrPayloadTooLarge) {
		t.Fatalf("oversize write = %d, %v", n, err)
	}
	c2.Close()
}
