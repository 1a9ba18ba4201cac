package afxdp

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

var (
	macA = [6]byte{0x02, 0, 0, 0, 0, 0xa}
	macB = [6]byte{0x02, 0, 0, 0, 0, 0xb}
	v4A  = netip.MustParseAddrPort("10.199.1.1:7400")
	v4B  = netip.MustParseAddrPort("10.199.1.2:7401")
	v6A  = netip.MustParseAddrPort("[fd00:199:1::1]:7400")
	v6B  = netip.MustParseAddrPort("[fd00:199:1::2]:7401")
)

// refChecksum is RFC 1071 done the slow, obvious way.
func refChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i < len(b); i += 2 {
		w := uint32(b[i]) << 8
		if i+1 < len(b) {
			w |= uint32(b[i+1])
		}
		s += w
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

func TestChecksumMatchesReference(t *testing.T) {
	b := make([]byte, 3001)
	for i := range b {
		b[i] = byte(i*7 + i>>3)
	}
	for n := 0; n <= len(b); n += 1 + n/7 {
		if got, want := checksumFold(checksumAdd(0, b[:n])), refChecksum(b[:n]); got != want {
			t.Fatalf("len %d: checksum %#x, reference %#x", n, got, want)
		}
	}
}

func build(t *testing.T, src, dst netip.AddrPort, payload []byte) []byte {
	t.Helper()
	f := mustBuild(src, dst, payload)
	if f == nil {
		t.Fatalf("buildFrame(%v -> %v) failed", src, dst)
	}
	return f
}

func mustBuild(src, dst netip.AddrPort, payload []byte) []byte {
	out := make([]byte, 2048)
	return out[:buildFrame(out, macA, macB, src, dst, 1, payload)]
}

func TestBuildParseRoundTrip(t *testing.T) {
	for _, pair := range [][2]netip.AddrPort{{v4A, v4B}, {v6A, v6B}} {
		for _, n := range []int{0, 1, 7, 64, 1023, 1452} {
			payload := bytes.Repeat([]byte{0xa5, 0x5a, 0x01}, n)[:n]
			f := build(t, pair[0], pair[1], payload)
			r, v := parseFrame(f, pair[1], false)
			if v != verdictOK || r.src != pair[0] || !bytes.Equal(r.payload, payload) || r.srcMAC != macA {
				t.Fatalf("%v len %d: verdict %d src %v mac %x", pair, n, v, r.src, r.srcMAC)
			}
			// The unspecified address of the family matches too.
			any := netip.AddrPortFrom(netip.IPv4Unspecified(), pair[1].Port())
			if pair[1].Addr().Is6() {
				any = netip.AddrPortFrom(netip.IPv6Unspecified(), pair[1].Port())
			}
			if _, v := parseFrame(f, any, false); v != verdictOK {
				t.Fatalf("unspecified local: verdict %d", v)
			}
		}
	}
	if n := buildFrame(make([]byte, 2048), macA, macB, v4A, v6B, 0, nil); n != 0 {
		t.Fatal("built a frame mixing families")
	}
	if n := buildFrame(make([]byte, 60), macA, macB, v4A, v4B, 0, make([]byte, 100)); n != 0 {
		t.Fatal("built a frame larger than its buffer")
	}
}

// TestParseRejects plants each kind of damage in a good frame and checks
// the parser classifies it (the checker catching planted bugs).
func TestParseRejects(t *testing.T) {
	payload := []byte("consensus message")
	good4 := build(t, v4A, v4B, payload)
	good6 := build(t, v6A, v6B, payload)
	mod := func(f []byte, fn func(b []byte) []byte) []byte {
		return fn(append([]byte(nil), f...))
	}
	// Offsets into an IPv4 frame.
	const ip, udp4, udp6 = 14, 34, 54
	fixIPv4Csum := func(b []byte) []byte {
		b[ip+10], b[ip+11] = 0, 0
		binary.BigEndian.PutUint16(b[ip+10:], ^checksumFold(checksumAdd(0, b[ip:ip+20])))
		return b
	}
	cases := []struct {
		name  string
		frame []byte
		local netip.AddrPort
		want  verdict
	}{
		{"empty", nil, v4B, verdictRunt},
		{"ethernet only", good4[:14], v4B, verdictRunt},
		{"ipv4 header cut", good4[:30], v4B, verdictRunt},
		{"ipv6 header cut", good6[:40], v6B, verdictRunt},
		{"ipv4 total length beyond frame", good4[:len(good4)-1], v4B, verdictTruncated},
		{"ipv6 payload length beyond frame", good6[:len(good6)-1], v6B, verdictTruncated},
		{"udp length beyond ip", mod(good4, func(b []byte) []byte { binary.BigEndian.PutUint16(b[udp4+4:], 200); return b }), v4B, verdictTruncated},
		{"udp length below header", mod(good6, func(b []byte) []byte { binary.BigEndian.PutUint16(b[udp6+4:], 7); return b }), v6B, verdictRunt},
		{"ipv4 total below udp", mod(good4, func(b []byte) []byte { binary.BigEndian.PutUint16(b[ip+2:], 27); return fixIPv4Csum(b) }), v4B, verdictRunt},
		{"payload bit flip v4", mod(good4, func(b []byte) []byte { b[len(b)-1] ^= 1; return b }), v4B, verdictBadChecksum},
		{"payload bit flip v6", mod(good6, func(b []byte) []byte { b[len(b)-1] ^= 0x80; return b }), v6B, verdictBadChecksum},
		{"ipv4 header checksum", mod(good4, func(b []byte) []byte { b[ip+8]--; return b }), v4B, verdictBadChecksum},
		{"ipv6 zero udp checksum", mod(good6, func(b []byte) []byte { b[udp6+6], b[udp6+7] = 0, 0; return b }), v6B, verdictBadChecksum},
		{"ipv4 zero udp checksum ok", mod(good4, func(b []byte) []byte { b[udp4+6], b[udp4+7] = 0, 0; return b }), v4B, verdictOK},
		{"arp", mod(good4, func(b []byte) []byte { b[12], b[13] = 0x08, 0x06; return b }), v4B, verdictForeign},
		{"vlan", mod(good4, func(b []byte) []byte { b[12], b[13] = 0x81, 0x00; return b }), v4B, verdictForeign},
		{"tcp", mod(good4, func(b []byte) []byte { b[ip+9] = 6; return fixIPv4Csum(b) }), v4B, verdictForeign},
		{"ip options", mod(good4, func(b []byte) []byte { b[ip] = 0x46; return b }), v4B, verdictForeign},
		{"fragment", mod(good4, func(b []byte) []byte { b[ip+6] = 0x20; return fixIPv4Csum(b) }), v4B, verdictForeign},
		{"v6 extension header", mod(good6, func(b []byte) []byte { b[ip+6] = 0; return b }), v6B, verdictForeign},
		{"wrong port", good4, netip.AddrPortFrom(v4B.Addr(), 9), verdictForeign},
		{"wrong address", good4, netip.AddrPortFrom(netip.MustParseAddr("10.199.1.3"), v4B.Port()), verdictForeign},
		{"v6 frame, v4 socket", good6, netip.AddrPortFrom(netip.IPv4Unspecified(), v6B.Port()), verdictForeign},
		{"v4 frame, v6 socket", good4, netip.AddrPortFrom(netip.IPv6Unspecified(), v4B.Port()), verdictForeign},
	}
	for _, tc := range cases {
		if _, v := parseFrame(tc.frame, tc.local, false); v != tc.want {
			t.Errorf("%s: verdict %d, want %d", tc.name, v, tc.want)
		}
	}

	// A veth peer with checksum offload sends only the pseudo-header sum:
	// refused by default, accepted when configured.
	partial := mod(good4, func(b []byte) []byte {
		ulen := len(b) - udp4
		ps := checksumAdd(0, b[ip+12:ip+20]) + protoUDP + uint32(ulen)
		binary.BigEndian.PutUint16(b[udp4+6:], checksumFold(ps))
		return b
	})
	if _, v := parseFrame(partial, v4B, false); v != verdictBadChecksum {
		t.Errorf("partial checksum without the option: verdict %d", v)
	}
	if r, v := parseFrame(partial, v4B, true); v != verdictOK || !bytes.Equal(r.payload, payload) {
		t.Errorf("partial checksum with the option: verdict %d", v)
	}
}

// FuzzParseFrame feeds arbitrary bytes to the parser: it must not panic,
// an accepted payload must lie inside the frame, and rebuilding the frame
// from what was parsed must parse to the same datagram.
func FuzzParseFrame(f *testing.F) {
	f.Add(mustBuild(v4A, v4B, []byte("seed")))
	f.Add(mustBuild(v6A, v6B, []byte("seed")))
	f.Fuzz(func(t *testing.T, frame []byte) {
		for _, local := range []netip.AddrPort{v4B, v6B, netip.AddrPortFrom(netip.IPv4Unspecified(), v4B.Port())} {
			for _, partial := range []bool{false, true} {
				r, v := parseFrame(frame, local, partial)
				if v != verdictOK {
					continue
				}
				if len(r.payload) > len(frame) {
					t.Fatalf("payload of %d bytes from a %d-byte frame", len(r.payload), len(frame))
				}
				out := make([]byte, len(r.payload)+frameOverheadBytes(true))
				dst := local
				if dst.Addr().IsUnspecified() {
					dst = v4B
				}
				n := buildFrame(out, r.srcMAC, macB, r.src, dst, 0, r.payload)
				if n == 0 {
					t.Fatalf("cannot rebuild %v -> %v", r.src, dst)
				}
				r2, v2 := parseFrame(out[:n], dst, false)
				if v2 != verdictOK || r2.src != r.src || !bytes.Equal(r2.payload, r.payload) {
					t.Fatalf("rebuilt frame: verdict %d src %v", v2, r2.src)
				}
			}
		}
	})
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func BenchmarkBuildFrame(b *testing.B) {
	out := make([]byte, 2048)
	payload := make([]byte, 256)
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		buildFrame(out, macA, macB, v4A, v4B, 1, payload)
	}
}

func BenchmarkParseFrame(b *testing.B) {
	f := mustBuild(v6A, v6B, make([]byte, 256))
	b.SetBytes(256)
	for b.Loop() {
		if _, v := parseFrame(f, v6B, false); v != verdictOK {
			b.Fatal(v)
		}
	}
}
