package afxdp_test

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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

// TestXDPSoak ping-pongs datagrams between two XDPConns (adaptive poll)
// with a bounded window of outstanding requests and checks every one is
// answered exactly once, in order, in native and in generic mode.
func TestXDPSoak(t *testing.T) {
	for i, attach := range []string{afxdp.AttachNative, afxdp.AttachGeneric} {
		t.Run(attach, func(t *testing.T) { soak(t, 30+i, attach) })
	}
}

func soak(t *testing.T, subnet int, attach string) {
	total := 100_000
	if testing.Short() {
		total = 10_000
	}
	const window = 32
	p := needNetns(t, subnet)
	const port = 7400
	srv := openXDP(t, p.NS[0], afxdp.Config{Interface: p.If[0], Port: port, Attach: attach})
	cli := openXDP(t, p.NS[1], afxdp.Config{Interface: p.If[1], Port: port, Attach: attach})

	received, lost, err := pingPong(cli, srv, total, window, 5*time.Second)
	fmt.Printf("afxdp soak: attach=%s packets=%d lost=%d\n", attach, received, lost)
	if err != nil {
		t.Fatalf("%v; client %+v server %+v", err, cli.Stats(), srv.Stats())
	}
	for _, c := range []*afxdp.XDPConn{srv, cli} {
		st := c.Stats()
		if st.RxBadChecksum+st.RxRunt+st.RxTruncated+st.RxForeign != 0 {
			t.Fatalf("%v dropped frames: %+v", c.LocalAddr(), st)
		}
		// The server learns the client's MAC from its first datagram; only
		// the client's first window, sent before any reply, may go through
		// the kernel.
		if st.TxKernel > window || st.RxKernel != 0 {
			t.Fatalf("%v used the kernel path: %+v", c.LocalAddr(), st)
		}
	}
}

// TestXDPBadInputCounted injects damaged frames with an AF_PACKET socket
// from namespace b straight at the XDP socket's port: each is counted in
// its class and dropped, and a good datagram behind them still arrives.
func TestXDPBadInputCounted(t *testing.T) {
	p := needNetns(t, 40)
	const port = 7400
	x := openXDP(t, p.NS[0], afxdp.Config{Interface: p.If[0], Port: port, Attach: afxdp.AttachNative, FrameCount: 256})
	var macA, macB [6]byte
	for i, mac := range []*[6]byte{&macA, &macB} {
		if err := netns.Run(p.NS[i], func() error {
			ifi, err := net.InterfaceByName(p.If[i])
			if err == nil {
				copy(mac[:], ifi.HardwareAddr)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	src := netip.AddrPortFrom(p.Addr4[1], 5555)
	frame := func(dst netip.AddrPort, payload string) []byte {
		out := make([]byte, 2048)
		return out[:afxdp.BuildFrame(out, macB, macA, src, dst, 1, []byte(payload))]
	}
	good := frame(x.LocalAddr(), "good")
	badCsum := frame(x.LocalAddr(), "bad-checksum")
	badCsum[len(badCsum)-1] ^= 0xff
	truncated := frame(x.LocalAddr(), "truncated payload")
	truncated = truncated[:len(truncated)-4]
	foreign := frame(netip.AddrPortFrom(netip.MustParseAddr("10.199.40.77"), port), "not our address")
	runt := frame(x.LocalAddr(), "runt")
	binary.BigEndian.PutUint16(runt[14+20+4:], 4) // UDP length below its header
	err := netns.Run(p.NS[1], func() error {
		ifi, err := net.InterfaceByName(p.If[1])
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}
		copy(sa.Addr[:], macA[:])
		for _, f := range [][]byte{badCsum, truncated, foreign, runt, good} {
			if err := unix.Sendto(fd, f, 0, sa); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("injecting frames: %v", err)
	}
	got, from := readN(t, x, 1, 10*time.Second)
	if got[0] != "good" || from[0] != src {
		t.Fatalf("got %q from %v", got[0], from[0])
	}
	st := x.Stats()
	if st.RxBadChecksum != 1 || st.RxTruncated != 1 || st.RxForeign != 1 || st.RxRunt != 1 || st.RxPackets != 1 {
		t.Fatalf("counters %+v, want one of each", st)
	}
}

// TestXDPErrorsSayWhatToChange provokes the usual failures and checks
// each error names the cause and the fix.
func TestXDPErrorsSayWhatToChange(t *testing.T) {
	p := needNetns(t, 50)
	const port = 7400
	inA := func(cfg afxdp.Config) (*afxdp.XDPConn, error) {
		var c *afxdp.XDPConn
		err := netns.Run(p.NS[0], func() (err error) {
			c, err = afxdp.NewXDP(cfg)
			return err
		})
		if c != nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}
	wantErr := func(name string, err error, words ...string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", name)
		}
		t.Logf("%s: %v", name, err)
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s: error %q does not mention %q", name, err, w)
			}
		}
	}

	// veth has no zero-copy AF_XDP.
	_, err := inA(afxdp.Config{Interface: p.If[0], Port: port, Attach: afxdp.AttachNative, ZeroCopy: true})
	wantErr("zero-copy on veth", err, "zero_copy = false")
	if !errors.Is(err, afxdp.ErrNotSupported) {
		t.Fatalf("zero-copy error %v does not wrap ErrNotSupported", err)
	}
	// ...so Open falls back to kernel UDP and says why.
	var conn afxdp.Conn
	var fallback error
	if err := netns.Run(p.NS[0], func() (err error) {
		conn, fallback, err = afxdp.Open(afxdp.Config{Interface: p.If[0], Port: port, Attach: afxdp.AttachNative, ZeroCopy: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, isUDP := conn.(*afxdp.UDPConn); !isUDP || fallback == nil || conn.LocalAddr() != netip.AddrPortFrom(p.Addr4[0], port) {
		t.Fatalf("Open fell back to %T on %v, reason %v", conn, conn.LocalAddr(), fallback)
	}
	conn.Close()

	// A bridge has no native XDP: native fails saying so, auto
	// falls back to generic.
	if _, err := netns.Exec(p.NS[0], "ip", "link", "add", "sxbr0", "type", "bridge"); err != nil {
		t.Fatal(err)
	}
	if _, err := netns.Exec(p.NS[0], "ip", "addr", "add", "10.199.51.1/24", "dev", "sxbr0"); err != nil {
		t.Fatal(err)
	}
	if _, err := netns.Exec(p.NS[0], "ip", "link", "set", "sxbr0", "up"); err != nil {
		t.Fatal(err)
	}
	_, err = inA(afxdp.Config{Interface: "sxbr0", Port: port, Attach: afxdp.AttachNative})
	wantErr("native on bridge", err, "native XDP", `attach = "generic"`)
	x, err := inA(afxdp.Config{Interface: "sxbr0", Port: port, Attach: afxdp.AttachAuto, FrameCount: 64})
	if err != nil {
		t.Fatalf("auto on bridge: %v", err)
	}
	if x.AttachMode() != afxdp.AttachGeneric {
		t.Fatalf("auto on bridge attached %q", x.AttachMode())
	}
	x.Close()

	// The port is taken by a kernel socket.
	taken := openUDP(t, p.NS[0], netip.AddrPortFrom(p.Addr4[0], port+1))
	_, err = inA(afxdp.Config{Interface: p.If[0], Port: taken.LocalAddr().Port()})
	wantErr("port taken", err, "address already in use")

	// RLIMIT_MEMLOCK without CAP_IPC_LOCK: drop the capability on the
	// throwaway thread netns.Run uses and lower the limit briefly.
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old); err != nil {
		t.Fatal(err)
	}
	err = netns.Run(p.NS[0], func() error {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return err
		}
		data[0].Effective &^= 1 << unix.CAP_IPC_LOCK
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return err
		}
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: 64 << 10, Max: old.Max}); err != nil {
			return err
		}
		defer unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old)
		c, err := afxdp.NewXDP(afxdp.Config{Interface: p.If[0], Port: port})
		if c != nil {
			c.Close()
		}
		return err
	})
	wantErr("memlock", err, "RLIMIT_MEMLOCK", "CAP_IPC_LOCK")
}

// TestXDPKernelPathNotLost sends IPv4 datagrams with IP options, which
// the XDP program passes to the kernel: the XDPConn still delivers them,
// through its kernel socket.
func TestXDPKernelPathNotLost(t *testing.T) {
	p := needNetns(t, 41)
	const port = 7400
	for _, poll := range []string{afxdp.PollAdaptive, afxdp.PollBusy} {
		x := openXDP(t, p.NS[0], afxdp.Config{Interface: p.If[0], Port: port, Poll: poll, FrameCount: 256})
		err := netns.Run(p.NS[1], func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			// NOP, NOP, NOP, end of options: IHL becomes 6.
			if err := unix.SetsockoptString(fd, unix.IPPROTO_IP, unix.IP_OPTIONS, "\x01\x01\x01\x00"); err != nil {
				return err
			}
			for i := 0; i < 3; i++ {
				if err := unix.Sendto(fd, []byte(fmt.Sprintf("with-options-%d", i)), 0, &unix.SockaddrInet4{Port: port, Addr: p.Addr4[0].As4()}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := readN(t, x, 3, 10*time.Second)
		if got[2] != "with-options-2" {
			t.Fatalf("%s: got %q", poll, got)
		}
		if st := x.Stats(); st.RxKernel != 3 || st.RxPackets != 3 {
			t.Fatalf("%s: stats %+v", poll, st)
		}
		x.Close()
	}
}

// TestXDPPartialChecksum reproduces the veth pitfall: with transmit
// checksum offload on at the kernel sender, datagrams carry only the
// pseudo-header sum. A verifying XDPConn counts them as bad checksums and
// drops them; with AcceptPartialChecksum it delivers them.
func TestXDPPartialChecksum(t *testing.T) {
	p := needNetns(t, 42)
	offload := func(on bool) {
		t.Helper()
		if err := netns.Run(p.NS[1], func() error { return afxdp.SetTxChecksum(p.If[1], on) }); err != nil {
			t.Fatal(err)
		}
	}
	peer := openUDP(t, p.NS[1], netip.AddrPortFrom(p.Addr4[1], 7401))
	for _, accept := range []bool{false, true} {
		x := openXDP(t, p.NS[0], afxdp.Config{Interface: p.If[0], Port: 7400, FrameCount: 256, AcceptPartialChecksum: accept})
		offload(true)
		sendAll(t, peer, x.LocalAddr(), "offloaded", 3)
		offload(false)
		sendAll(t, peer, x.LocalAddr(), "full", 1)
		want, bad := []string{"offloaded-0000", "offloaded-0001", "offloaded-0002", "full-0000"}, uint64(0)
		if !accept {
			want, bad = []string{"full-0000"}, 3
		}
		got, _ := readN(t, x, len(want), 10*time.Second)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("accept=%v: got %q, want %q", accept, got, want)
		}
		if st := x.Stats(); st.RxBadChecksum != bad {
			t.Fatalf("accept=%v: %+v, want %d bad checksums", accept, st, bad)
		}
		x.Close()
	}
}

// TestXDPNeighbourFromKernelTable checks the netlink path: once the
// kernel's neighbour table knows the peer (a ping resolved it), even the
// first datagram leaves through the TX ring, IPv4 and IPv6.
func TestXDPNeighbourFromKernelTable(t *testing.T) {
	p := needNetns(t, 43)
	for i, pair := range [][2]netip.Addr{{p.Addr4[0], p.Addr4[1]}, {p.Addr6[0], p.Addr6[1]}} {
		if err := netns.Ping(p.NS[0], pair[1], 5*time.Second); err != nil {
			t.Fatal(err)
		}
		x := openXDP(t, p.NS[0], afxdp.Config{Interface: p.If[0], Addr: pair[0], Port: uint16(7400 + i), FrameCount: 256})
		peer := openUDP(t, p.NS[1], netip.AddrPortFrom(pair[1], 7500))
		sendAll(t, x, peer.LocalAddr(), "first", 3)
		got, from := readN(t, peer, 3, 10*time.Second)
		if got[0] != "first-0000" || from[0] != x.LocalAddr() {
			t.Fatalf("got %q from %v", got, from)
		}
		if st := x.Stats(); st.TxKernel != 0 || st.TxPackets != 3 {
			t.Fatalf("%v: the neighbour table was not used: %+v", pair[1], st)
		}
		x.Close() // one socket per queue
	}
}

// TestXDPBindBusyBounded opens a second socket on a queue that already
// has one: bind keeps getting EBUSY, retries for a bounded time, then
// fails saying why.
func TestXDPBindBusyBounded(t *testing.T) {
	p := needNetns(t, 44)
	openXDP(t, p.NS[0], afxdp.Config{Interface: p.If[0], Port: 7400, FrameCount: 64})
	start := time.Now()
	err := netns.Run(p.NS[0], func() error {
		c, err := afxdp.NewXDP(afxdp.Config{Interface: p.If[0], Port: 7401, FrameCount: 64})
		if c != nil {
			c.Close()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "another AF_XDP socket holds this queue") {
		t.Fatalf("second bind: %v", err)
	}
	if waited := time.Since(start); waited > time.Minute {
		t.Fatalf("bind retried for %v", waited)
	}
	t.Logf("second bind after %v: %v", time.Since(start).Round(time.Millisecond), err)
}

// TestXDPChildHolder is not a test on its own: TestXDPRebindAfterKill runs
// the test binary with AFXDP_HOLD_NS/AFXDP_HOLD_IF set, and then this opens
// an XDPConn there, says "ready" and waits to be killed.
func TestXDPChildHolder(t *testing.T) {
	ns, ifname := os.Getenv("AFXDP_HOLD_NS"), os.Getenv("AFXDP_HOLD_IF")
	if ns == "" {
		t.Skip("helper process for TestXDPRebindAfterKill")
	}
	var c *afxdp.XDPConn
	if err := netns.Run(ns, func() (err error) {
		c, err = afxdp.NewXDP(afxdp.Config{Interface: ifname, Port: 7400})
		return err
	}); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	pkts := []afxdp.Packet{{Buf: make([]byte, 2048)}}
	for {
		c.ReadBatch(pkts) // hold the socket until SIGKILL
	}
}

// TestXDPRebindAfterKill kills a process holding the queue with SIGKILL
// and rebinds at once: the kernel releases the old socket asynchronously,
// and the bounded EBUSY retry covers that.
func TestXDPRebindAfterKill(t *testing.T) {
	p := needNetns(t, 45)
	for round := 0; round < 3; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestXDPChildHolder$", "-test.count=1")
		cmd.Env = append(os.Environ(), "AFXDP_HOLD_NS="+p.NS[0], "AFXDP_HOLD_IF="+p.If[0])
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "ready\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child: %q, %v", line, err)
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		start := time.Now()
		x := openXDP(t, p.NS[0], afxdp.Config{Interface: p.If[0], Port: 7400})
		t.Logf("round %d: rebound %v after the kill", round, time.Since(start).Round(time.Microsecond))
		x.Close()
	}
}

// TestXDPLANThreeNodes puts three XDPConns on one bridged segment (the
// shape of a 3-node cluster) and has every node send to every other.
func TestXDPLANThreeNodes(t *testing.T) {
	if err := netns.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true but %v", err)
		}
		t.Skip(err)
	}
	lan, err := netns.NewLAN(fmt.Sprintf("synod-xdp-%d-lan", os.Getpid()), 46, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lan.Close(); err != nil {
			t.Errorf("removing namespaces: %v", err)
		}
	})
	var conns []*afxdp.XDPConn
	for i := range lan.NS {
		conns = append(conns, openXDP(t, lan.NS[i], afxdp.Config{Interface: lan.If[i], Port: 7400, FrameCount: 256}))
	}
	const rounds = 50
	// Round 0 may go partly through the kernel (neighbours unresolved);
	// by round 1 every node learned every other's MAC from round 0, so
	// it must leave through the TX rings only.
	for round := 0; round < 2; round++ {
		kernelBefore := make([]uint64, len(conns))
		for i, c := range conns {
			kernelBefore[i] = c.Stats().TxKernel
		}
		exchange(t, asConns(conns), rounds)
		for i, c := range conns {
			if k := c.Stats().TxKernel; round == 1 && k != kernelBefore[i] {
				t.Fatalf("node %d sent %d datagrams through the kernel in round 1", i, k-kernelBefore[i])
			}
		}
	}
}

func asConns(xs []*afxdp.XDPConn) []afxdp.Conn {
	var cs []afxdp.Conn
	for _, x := range xs {
		cs = append(cs, x)
	}
	return cs
}

// exchange has every conn send rounds datagrams to every other and checks
// each received exactly rounds from each, with no frame dropped.
func exchange(t *testing.T, conns []afxdp.Conn, rounds int) {
	t.Helper()
	for i, c := range conns {
		for j, d := range conns {
			if i != j {
				sendAll(t, c, d.LocalAddr(), fmt.Sprintf("from-%d", i), rounds)
			}
		}
	}
	for j, d := range conns {
		got, from := readN(t, d, 2*rounds, 10*time.Second)
		count := map[netip.AddrPort]int{}
		for k := range got {
			count[from[k]]++
		}
		for i, c := range conns {
			if i != j && count[c.LocalAddr()] != rounds {
				t.Fatalf("node %d got %d datagrams from node %d, want %d", j, count[c.LocalAddr()], i, rounds)
			}
		}
		if sd, ok := d.(interface{ Stats() afxdp.Counters }); ok {
			if st := sd.Stats(); st.RxBadChecksum+st.RxForeign+st.RxTruncated+st.RxRunt != 0 {
				t.Fatalf("node %d: %+v", j, st)
			}
		}
	}
}

// TestMixedLAN is the heterogeneous deployment at the transport level: two
// AF_XDP nodes and one kernel UDP node on one segment, all to all, twice.
func TestMixedLAN(t *testing.T) {
	if err := netns.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true but %v", err)
		}
		t.Skip(err)
	}
	lan, err := netns.NewLAN(fmt.Sprintf("synod-xdp-%d-mix", os.Getpid()), 47, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lan.Close(); err != nil {
			t.Errorf("removing namespaces: %v", err)
		}
	})
	conns := []afxdp.Conn{
		openXDP(t, lan.NS[0], afxdp.Config{Interface: lan.If[0], Port: 7400, FrameCount: 256}),
		openXDP(t, lan.NS[1], afxdp.Config{Interface: lan.If[1], Port: 7400, FrameCount: 256, Attach: afxdp.AttachGeneric}),
		openUDP(t, lan.NS[2], netip.AddrPortFrom(lan.Addr4[2], 7400)),
	}
	for round := 0; round < 2; round++ {
		exchange(t, conns, 50)
	}
}
