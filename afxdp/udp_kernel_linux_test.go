package afxdp

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

// TestKernelRxDroppedCounted holds KernelRxDropped's contract: a burst
// into a socket with a small receive buffer that nobody reads overflows
// it, and every datagram sent is either delivered or counted dropped
// (loopback loses nothing else). The consensus sockets ask for
// ConsensusSocketBufferBytes and get at least the kernel's default.
func TestKernelRxDroppedCounted(t *testing.T) {
	const burst = 2000
	c, err := NewUDP(netip.MustParseAddrPort("127.0.0.1:0"), UDPOptions{BatchSize: 64, SocketBufferBytes: 4096})
	if err != nil {
		t.Skipf("no UDP here: %v", err)
	}
	defer c.Close()
	if d, err := c.KernelRxDropped(); err != nil || d != 0 {
		t.Fatalf("a fresh socket: KernelRxDropped = %d, %v; want 0", d, err)
	}
	u, err := net.Dial("udp", c.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	msg := make([]byte, 100)
	for i := 0; i < burst; i++ {
		if _, err := u.Write(msg); err != nil {
			t.Fatal(err)
		}
	}
	delivered := 0
	pkts := make([]Packet, 64)
	for i := range pkts {
		pkts[i].Buf = make([]byte, 256)
	}
	for {
		n, err := c.readNonblock(pkts)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		delivered += n
	}
	dropped, err := c.KernelRxDropped()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel drops: sent=%d delivered=%d dropped=%d", burst, delivered, dropped)
	if dropped == 0 || delivered+int(dropped) != burst {
		t.Fatalf("sent %d: delivered %d + dropped %d; want every datagram in one or the other, some dropped", burst, delivered, dropped)
	}

	big, err := NewUDP(netip.MustParseAddrPort("127.0.0.1:0"), UDPOptions{SocketBufferBytes: ConsensusSocketBufferBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	small, err := NewUDP(netip.MustParseAddrPort("127.0.0.1:0"), UDPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	gb, err1 := big.ReceiveBufferBytes()
	gs, err2 := small.ReceiveBufferBytes()
	t.Logf("receive buffer granted: asked %d -> %d, default %d", ConsensusSocketBufferBytes, gb, gs)
	if err1 != nil || err2 != nil || gb < gs {
		t.Fatalf("receive buffers: consensus %d (%v), default %d (%v)", gb, err1, gs, err2)
	}
	// The outside tester's burst (1,200 datagrams at once, 230-305 lost
	// with the default buffer) fits a consensus socket's buffer whole
	// where net.core.rmem_max grants what it asks.
	if gb < ConsensusSocketBufferBytes {
		t.Logf("net.core.rmem_max grants only %d bytes: the burst check is left out", gb)
		return
	}
	for _, sock := range []struct {
		name string
		c    *UDPConn
	}{{"default", small}, {"consensus", big}} {
		u, err := net.Dial("udp", sock.c.LocalAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 1200; i++ {
			u.Write(msg)
		}
		u.Close()
		d, err := sock.c.KernelRxDropped()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("a burst of 1200 into the %s buffer: dropped=%d", sock.name, d)
		if sock.name == "consensus" && d != 0 {
			t.Fatalf("the consensus buffer dropped %d of a 1200-datagram burst", d)
		}
	}
}

// TestUDPTableDropsMalformed: the /proc/net/udp reader finds the row by
// inode and refuses what it cannot read, never a silent 0.
func TestUDPTableDropsMalformed(t *testing.T) {
	const header = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n"
	row := func(inode, drops string) string {
		return "  1: 0100007F:9C40 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 " + inode + " 2 0000000000000000 " + drops + "\n"
	}
	for _, tc := range []struct {
		name, table string
		want        uint64
		err         string
	}{
		{"found", header + row("111", "0") + row("4242", "17"), 17, ""},
		{"header only", header, 0, "no row"},
		{"empty", "", 0, "no row"},
		{"other inodes", header + row("1", "5"), 0, "no row"},
		{"bad drops", header + row("4242", "x"), 0, "drops column"},
		{"short row", header + "  1: 0100007F:9C40 4242\n", 0, "no row"},
		{"a row as header", row("4242", "3"), 0, "no row"},
		{"huge line", header + strings.Repeat("x", 10000) + "\n" + row("4242", "1"), 0, "reading"},
	} {
		got, err := udpTableDrops([]byte(tc.table), 4242)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%s: %d, %v; want %d", tc.name, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %d, %v; want an error with %q", tc.name, got, err, tc.err)
		}
	}
}
