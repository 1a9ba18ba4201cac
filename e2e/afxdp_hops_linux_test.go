package e2e

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"synod/afxdp"
	"synod/afxdp/netns"
)

// Limits of the wire capture.
const (
	hopCaptureFor     = 1500 * time.Millisecond
	hopWarmup         = 300 * time.Millisecond
	hopFramesMax      = 1 << 20 // frames kept per capture
	hopFrameBytesMax  = 2048
	hopOOBBytes       = 128
	hopReadTimeoutUs  = 100_000
	hopEtherHdrBytes  = 14
	hopIPv4HdrMin     = 20
	hopL4HdrMin       = 8
	hopEtherTypeIPv4  = 0x0800
	hopProtoTCP       = 6
	hopProtoUDP       = 17
	hopTCPHdrMinBytes = 20
)

// wireFrame is one IPv4 frame seen on the hub bridge.
type wireFrame struct {
	at           time.Duration // kernel receive timestamp, from the first frame
	src, dst     netip.Addr
	proto        byte
	sport, dport uint16
	payload      int // L4 payload bytes
}

// hopTimes are the three legs of one put, as seen on the wire: leader
// gets the client's request -> leader's first consensus datagram
// (propose), that datagram -> the follower's answer (follower turnaround:
// receive, persist, send), the answer -> leader's reply to the client
// (commit, apply, answer).
type hopTimes struct {
	propose, follower, finish []time.Duration
}

// captureHub records IPv4 frames entering the hub bridge's ports (each
// frame once, as its sender put it on the wire) for d, with kernel
// timestamps.
func captureHub(hub string, d time.Duration) ([]wireFrame, error) {
	var out []wireFrame
	err := netns.Run(hub, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(hostToNet16(unix.ETH_P_ALL)))
		if err != nil {
			return fmt.Errorf("AF_PACKET socket: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
			return err
		}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: hopReadTimeoutUs}); err != nil {
			return err
		}
		buf := make([]byte, hopFrameBytesMax)
		oob := make([]byte, hopOOBBytes)
		var t0 int64
		for end := time.Now().Add(d); time.Now().Before(end) && len(out) < hopFramesMax; {
			n, oobn, _, from, err := unix.Recvmsg(fd, buf, oob, 0)
			if err != nil {
				continue
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); !ok || ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			ts := kernelStamp(oob[:oobn])
			if ts == 0 {
				continue
			}
			f, ok := parseWireFrame(buf[:n])
			if !ok {
				continue
			}
			if t0 == 0 {
				t0 = ts
			}
			f.at = time.Duration(ts - t0)
			out = append(out, f)
		}
		return nil
	})
	return out, err
}

func hostToNet16(v uint16) uint16 { return v<<8 | v>>8 }

// kernelStamp is the SO_TIMESTAMPNS of a packet (0 if absent).
func kernelStamp(oob []byte) int64 {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
			return (*unix.Timespec)(unsafe.Pointer(&m.Data[0])).Nano()
		}
	}
	return 0
}

// parseWireFrame decodes Ethernet/IPv4/TCP-or-UDP headers; anything else
// or anything short is not ok.
func parseWireFrame(b []byte) (wireFrame, bool) {
	var f wireFrame
	if len(b) < hopEtherHdrBytes+hopIPv4HdrMin || binary.BigEndian.Uint16(b[12:]) != hopEtherTypeIPv4 {
		return f, false
	}
	ip := b[hopEtherHdrBytes:]
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:]))
	if ip[0]>>4 != 4 || ihl < hopIPv4HdrMin || total < ihl+hopL4HdrMin || total > len(ip) {
		return f, false
	}
	f.proto = ip[9]
	f.src = netip.AddrFrom4([4]byte(ip[12:16]))
	f.dst = netip.AddrFrom4([4]byte(ip[16:20]))
	l4 := ip[ihl:total]
	f.sport, f.dport = binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
	switch f.proto {
	case hopProtoUDP:
		f.payload = len(l4) - hopL4HdrMin
	case hopProtoTCP:
		if len(l4) < hopTCPHdrMinBytes || int(l4[12]>>4)*4 > len(l4) {
			return f, false
		}
		f.payload = len(l4) - int(l4[12]>>4)*4
	default:
		return f, false
	}
	return f, true
}

// extractHops walks the frames of a one-request-at-a-time put workload
// against leader (client port clientPort) and times each put's three legs.
// A put whose legs do not appear in order (a retransmission, a leader
// change) restarts at the next client request.
func extractHops(frames []wireFrame, leader netip.Addr, clientPort uint16) hopTimes {
	var h hopTimes
	const (
		idle = iota
		requested
		proposed
		answered
	)
	state := idle
	var last, propose, follow time.Duration
	var follower netip.Addr
	for _, f := range frames {
		switch {
		case f.proto == hopProtoTCP && f.dst == leader && f.dport == clientPort && f.payload > 0:
			state, last = requested, f.at
		case state == requested && f.proto == hopProtoUDP && f.src == leader && f.payload > 0:
			propose = f.at - last
			state, last, follower = proposed, f.at, f.dst
		case state == proposed && f.proto == hopProtoUDP && f.src == follower && f.dst == leader:
			follow = f.at - last
			state, last = answered, f.at
		case state == answered && f.proto == hopProtoTCP && f.src == leader && f.sport == clientPort && f.payload > 0:
			// Only complete puts count.
			h.propose = append(h.propose, propose)
			h.follower = append(h.follower, follow)
			h.finish = append(h.finish, f.at-last)
			state = idle
		}
	}
	return h
}

func quantile(x []time.Duration, q float64) time.Duration {
	if len(x) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), x...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(q*float64(len(s)-1))]
}

// BenchmarkAFXDPHops breaks a put down into its legs on the wire, for an
// AF_XDP cluster and a UDP cluster built alike (see
// BenchmarkAFXDPCommitLatency): one client puts in a closed loop while an
// AF_PACKET socket in the hub namespace timestamps every frame entering
// the bridge. Per leg it prints p50/p90: propose (client request in ->
// leader's first consensus datagram out), follower (that datagram ->
// the follower's answer: receive, persist, send), finish (the answer ->
// the leader's reply to the client: commit, apply, answer). The
// difference between the two transports lands in the legs that receive
// a datagram.
//
//	go test -run '^$' -bench AFXDPHops -benchtime 1x ./e2e/
func BenchmarkAFXDPHops(b *testing.B) {
	var tb strings.Builder
	fmt.Fprintf(&tb, "| cluster | puts | propose p50/p90 µs | follower p50/p90 µs | finish p50/p90 µs |\n| --- | --- | --- | --- | --- |\n")
	for i, kind := range []string{afxdp.TransportAFXDP, afxdp.TransportUDP} {
		nc := newNSCluster(b, "hop"+kind, nsSubnet(4+i), []string{kind, kind, kind})
		l := nc.leader()
		cl := dialClient(b, nc.endpoints(l), tenantA.token, killClientRetries)
		stop, done := make(chan struct{}), make(chan error, 1)
		go func() {
			ctx, cancel := ctxTimeout(time.Hour)
			defer cancel()
			value := make([]byte, latValueBytes)
			for n := 0; ; n++ {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				if err := cl.Put(ctx, []byte(fmt.Sprintf("hop%05d", n%latKeySpace)), value); err != nil {
					done <- err
					return
				}
			}
		}()
		time.Sleep(hopWarmup)
		b.ResetTimer()
		frames, err := captureHub(nc.lan.Hub, hopCaptureFor)
		b.StopTimer()
		close(stop)
		werr := <-done
		cl.Close()
		if err != nil {
			b.Fatal(err)
		}
		if werr != nil {
			b.Fatalf("%s: put: %v", kind, werr)
		}
		h := extractHops(frames, netip.MustParseAddrPort(l.client).Addr(), nsClientPort)
		if len(h.finish) == 0 {
			b.Fatalf("%s: no complete put in %d captured frames", kind, len(frames))
		}
		us := func(x []time.Duration) string {
			return fmt.Sprintf("%d / %d", quantile(x, 0.5).Microseconds(), quantile(x, 0.9).Microseconds())
		}
		fmt.Fprintf(&tb, "| %s x3 | %d | %s | %s | %s |\n", kind, len(h.finish), us(h.propose), us(h.follower), us(h.finish))
		b.ReportMetric(float64(quantile(h.follower, 0.5).Microseconds()), kind+"-follower-p50-us")
	}
	fmt.Fprintf(os.Stdout, "put legs on the wire, 3 nodes in namespaces, 1 client, %d CPUs (%s UTC):\n%s",
		nsCPUs(), time.Now().UTC().Format("15:04"), tb.String())
}

func nsCPUs() int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0
	}
	return set.Count()
}

// TestExtractHops feeds extractHops a synthetic capture: two clean puts,
// one broken by a leader change (its answer never comes), and noise
// (heartbeats, ACKs without payload). Only the clean puts count.
func TestExtractHops(t *testing.T) {
	L, F := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	C := netip.MustParseAddr("10.0.0.254")
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	req := func(at int) wireFrame {
		return wireFrame{at: us(at), src: C, dst: L, proto: hopProtoTCP, sport: 40000, dport: 7001, payload: 50}
	}
	acc := func(at int) wireFrame {
		return wireFrame{at: us(at), src: L, dst: F, proto: hopProtoUDP, sport: 7011, dport: 7011, payload: 90}
	}
	ans := func(at int) wireFrame {
		return wireFrame{at: us(at), src: F, dst: L, proto: hopProtoUDP, sport: 7011, dport: 7011, payload: 40}
	}
	rep := func(at int) wireFrame {
		return wireFrame{at: us(at), src: L, dst: C, proto: hopProtoTCP, sport: 7001, dport: 40000, payload: 20}
	}
	ack := wireFrame{at: us(5), src: L, dst: C, proto: hopProtoTCP, sport: 7001, dport: 40000}
	frames := []wireFrame{
		ans(1), ack, // noise before any request
		req(10), acc(30), ans(80), rep(120), // put 1: 20 / 50 / 40
		req(200), acc(210), // broken: no answer; the next request restarts
		req(300), acc(340), ans(360), rep(400), // put 2: 40 / 20 / 40
	}
	h := extractHops(frames, L, 7001)
	want := hopTimes{
		propose:  []time.Duration{us(20), us(40)},
		follower: []time.Duration{us(50), us(20)},
		finish:   []time.Duration{us(40), us(40)},
	}
	if fmt.Sprint(h) != fmt.Sprint(want) {
		t.Fatalf("extractHops = %v, want %v", h, want)
	}
	if _, ok := parseWireFrame(make([]byte, 10)); ok {
		t.Fatal("parseWireFrame accepted a runt")
	}
	// A real Ethernet/IPv4/UDP frame with 5 payload bytes.
	frame := make([]byte, hopEtherHdrBytes+hopIPv4HdrMin+hopL4HdrMin+5)
	binary.BigEndian.PutUint16(frame[12:], hopEtherTypeIPv4)
	ip := frame[hopEtherHdrBytes:]
	ip[0], ip[9] = 0x45, hopProtoUDP
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	copy(ip[12:], L.AsSlice())
	copy(ip[16:], F.AsSlice())
	binary.BigEndian.PutUint16(ip[20:], 7011)
	binary.BigEndian.PutUint16(ip[22:], 7012)
	got, ok := parseWireFrame(frame)
	if !ok || got.src != L || got.dst != F || got.sport != 7011 || got.dport != 7012 || got.payload != 5 {
		t.Fatalf("parseWireFrame = %+v, %v", got, ok)
	}
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)+1)) // IP length beyond the frame
	if _, ok := parseWireFrame(frame); ok {
		t.Fatal("parseWireFrame accepted a truncated frame")
	}
}
