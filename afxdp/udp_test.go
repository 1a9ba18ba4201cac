//go:build linux

package afxdp

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

func testUDPPair(t *testing.T, host string) {
	a, err := NewUDP(netip.AddrPortFrom(netip.MustParseAddr(host), 0), UDPOptions{BatchSize: 16})
	if err != nil {
		t.Skipf("no %s loopback: %v", host, err)
	}
	defer a.Close()
	b, err := NewUDP(netip.AddrPortFrom(netip.MustParseAddr(host), 0), UDPOptions{BatchSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	const total = 100 // more than one batch: sendmmsg is called in chunks
	out := make([]Packet, total)
	for i := range out {
		out[i] = pkt(fmt.Sprintf("msg-%03d", i), b.LocalAddr())
	}
	if n, err := a.WriteBatch(out); n != total || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	in := make([]Packet, b.BatchSize())
	for i := range in {
		in[i].Buf = make([]byte, 64)
	}
	got := 0
	for got < total {
		n, err := b.ReadBatch(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range in[:n] {
			if want := fmt.Sprintf("msg-%03d", got); string(p.Buf[:p.N]) != want || p.Addr != a.LocalAddr() {
				t.Fatalf("packet %d = %q from %v, want %q from %v", got, p.Buf[:p.N], p.Addr, want, a.LocalAddr())
			}
			got++
		}
	}
	if s := b.Stats(); s.RxPackets != total {
		t.Fatalf("RxPackets = %d", s.RxPackets)
	}

	// A datagram longer than the reader's buffer is counted and dropped.
	small := []Packet{{Buf: make([]byte, 8)}}
	a.WriteBatch([]Packet{pkt(string(make([]byte, 100)), b.LocalAddr()), pkt("short", b.LocalAddr())})
	if n, err := b.ReadBatch(small); n != 1 || err != nil || string(small[0].Buf[:small[0].N]) != "short" {
		t.Fatalf("ReadBatch = %d, %v, %q", n, err, small[0].Buf[:small[0].N])
	}
	if b.Stats().RxTruncated != 1 {
		t.Fatalf("RxTruncated = %d, want 1", b.Stats().RxTruncated)
	}

	// Wrong family and oversize payloads are refused, not sent.
	other := netip.MustParseAddrPort("[::1]:9")
	if netip.MustParseAddr(host).Is6() {
		other = netip.MustParseAddrPort("127.0.0.1:9")
	}
	if n, err := a.WriteBatch([]Packet{pkt("x", other)}); n != 0 || err == nil {
		t.Fatalf("cross-family write = %d, %v", n, err)
	}
	if n, err := a.WriteBatch([]Packet{pkt(string(make([]byte, a.MaxPayload()+1)), b.LocalAddr())}); n != 0 || !errors.Is(err, ErrPayloadTooLarge) {
		t.Fatalf("oversize write = %d, %v", n, err)
	}

	// Close unblocks a reader with ErrClosed.
	errc := make(chan error, 1)
	go func() { _, err := b.ReadBatch(in); errc <- err }()
	time.Sleep(10 * time.Millisecond)
	b.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("read after close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not unblock ReadBatch")
	}
}

func TestUDPBatchIPv4(t *testing.T) { testUDPPair(t, "127.0.0.1") }
func TestUDPBatchIPv6(t *testing.T) { testUDPPair(t, "::1") }

func TestPinToCPURejectsInvalid(t *testing.T) {
	if err := PinToCPU(-1); err == nil {
		t.Fatal("PinToCPU(-1) succeeded")
	}
	if err := PinToCPU(cpuSetSizeMax - 1); err == nil {
		t.Fatal("PinToCPU(last) succeeded on a machine without that cpu")
	}
	done := make(chan error)
	go func() { done <- PinToCPU(0) }()
	if err := <-done; err != nil {
		t.Fatalf("PinToCPU(0): %v", err)
	}
}
