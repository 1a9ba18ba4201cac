package afxdp

import (
	"encoding/binary"
	"net/netip"
)

// Frame layout: what the AF_XDP socket reads and writes is a whole Ethernet
// frame. We carry exactly one shape and treat everything else as foreign:
//
//	| Ethernet | 14 B: dst MAC, src MAC, EtherType 0x0800 or 0x86DD (no VLAN) |
//	| IPv4     | 20 B: version 4, IHL 5 (no options), not fragmented, proto 17 |
//	| or IPv6  | 40 B: version 6, next header 17 (no extension headers)        |
//	| UDP      |  8 B: ports, length, checksum (full, never offloaded)         |
//	| payload  |  the opaque datagram                                          |
const (
	ethHeaderBytes  = 14
	ipv4HeaderBytes = 20
	ipv6HeaderBytes = 40
	udpHeaderBytes  = 8

	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
	protoUDP      = 17
	ipTTLHops     = 64
)

// verdict classifies a received frame; each non-OK value has a counter.
type verdict uint8

const (
	verdictOK verdict = iota
	verdictRunt
	verdictTruncated
	verdictBadChecksum
	verdictForeign
)

// rxFrame is what parseFrame extracts from a frame addressed to us.
type rxFrame struct {
	src     netip.AddrPort
	srcMAC  [6]byte
	payload []byte // aliases the frame
}

// parseFrame checks that frame is a UDP datagram to local (an unspecified
// local address matches any destination address of its family) and
// returns its payload. It never panics, whatever the bytes.
// acceptPartial also accepts a UDP checksum field holding only the folded
// pseudo-header sum, which is what a veth peer with transmit checksum
// offload puts on the wire.
func parseFrame(frame []byte, local netip.AddrPort, acceptPartial bool) (rxFrame, verdict) {
	var r rxFrame
	if len(frame) < ethHeaderBytes {
		return r, verdictRunt
	}
	copy(r.srcMAC[:], frame[6:12])
	var (
		udp      []byte // UDP header + payload, cut to the IP length
		srcIP    netip.Addr
		dstIP    netip.Addr
		pseudo   uint32
		isV6     bool
		ipPacket = frame[ethHeaderBytes:]
	)
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case etherTypeIPv4:
		if len(ipPacket) < ipv4HeaderBytes {
			return r, verdictRunt
		}
		if ipPacket[0] != 0x45 {
			return r, verdictForeign // not IPv4, or IP options
		}
		if binary.BigEndian.Uint16(ipPacket[6:8])&0x3fff != 0 {
			return r, verdictForeign // a fragment
		}
		if ipPacket[9] != protoUDP {
			return r, verdictForeign
		}
		total := int(binary.BigEndian.Uint16(ipPacket[2:4]))
		if total < ipv4HeaderBytes+udpHeaderBytes {
			return r, verdictRunt
		}
		if total > len(ipPacket) {
			return r, verdictTruncated
		}
		if checksumFold(checksumAdd(0, ipPacket[:ipv4HeaderBytes])) != 0xffff {
			return r, verdictBadChecksum
		}
		srcIP = netip.AddrFrom4([4]byte(ipPacket[12:16]))
		dstIP = netip.AddrFrom4([4]byte(ipPacket[16:20]))
		udp = ipPacket[ipv4HeaderBytes:total]
		pseudo = checksumAdd(0, ipPacket[12:20])
	case etherTypeIPv6:
		if len(ipPacket) < ipv6HeaderBytes {
			return r, verdictRunt
		}
		if ipPacket[0]>>4 != 6 || ipPacket[6] != protoUDP {
			return r, verdictForeign
		}
		plen := int(binary.BigEndian.Uint16(ipPacket[4:6]))
		if plen < udpHeaderBytes {
			return r, verdictRunt
		}
		if ipv6HeaderBytes+plen > len(ipPacket) {
			return r, verdictTruncated
		}
		srcIP = netip.AddrFrom16([16]byte(ipPacket[8:24]))
		dstIP = netip.AddrFrom16([16]byte(ipPacket[24:40]))
		udp = ipPacket[ipv6HeaderBytes : ipv6HeaderBytes+plen]
		pseudo = checksumAdd(0, ipPacket[8:40])
		isV6 = true
	default:
		return r, verdictForeign
	}
	ulen := int(binary.BigEndian.Uint16(udp[4:6]))
	if ulen < udpHeaderBytes {
		return r, verdictRunt
	}
	if ulen > len(udp) {
		return r, verdictTruncated
	}
	udp = udp[:ulen]
	if binary.BigEndian.Uint16(udp[2:4]) != local.Port() {
		return r, verdictForeign
	}
	la := local.Addr().Unmap()
	if la.IsValid() && !la.IsUnspecified() && la != dstIP {
		return r, verdictForeign
	}
	if la.IsValid() && la.Is4() == isV6 {
		return r, verdictForeign // the other family
	}
	pseudo += uint32(protoUDP) + uint32(ulen)
	switch csum := binary.BigEndian.Uint16(udp[6:8]); {
	case csum == 0 && !isV6:
		// IPv4 allows "no checksum".
	case csum == 0:
		return r, verdictBadChecksum
	case checksumFold(checksumAdd(pseudo, udp)) == 0xffff:
	case acceptPartial && csum == checksumFold(pseudo):
	default:
		return r, verdictBadChecksum
	}
	r.src = netip.AddrPortFrom(srcIP, binary.BigEndian.Uint16(udp[0:2]))
	r.payload = udp[udpHeaderBytes:]
	return r, verdictOK
}

// frameOverheadBytes is how many header bytes a datagram to addr needs.
func frameOverheadBytes(v6 bool) int {
	if v6 {
		return ethHeaderBytes + ipv6HeaderBytes + udpHeaderBytes
	}
	return ethHeaderBytes + ipv4HeaderBytes + udpHeaderBytes
}

// buildFrame writes an Ethernet/IP/UDP frame carrying payload from src to
// dst into out and returns its length, or 0 if out is too small or the
// addresses are of different families. The UDP checksum is computed in
// full: receivers never see an offloaded partial sum from us. ipID is the
// IPv4 identification field (ignored for IPv6).
func buildFrame(out []byte, srcMAC, dstMAC [6]byte, src, dst netip.AddrPort, ipID uint16, payload []byte) int {
	sa, da := src.Addr().Unmap(), dst.Addr().Unmap()
	v6 := sa.Is6()
	if sa.Is4() != da.Is4() || !sa.IsValid() {
		return 0
	}
	n := frameOverheadBytes(v6) + len(payload)
	if n > len(out) || len(payload) > 0xffff-ipv6HeaderBytes-udpHeaderBytes {
		return 0
	}
	f := out[:n]
	copy(f[0:6], dstMAC[:])
	copy(f[6:12], srcMAC[:])
	ulen := udpHeaderBytes + len(payload)
	var udp []byte
	var pseudo uint32
	if v6 {
		binary.BigEndian.PutUint16(f[12:14], etherTypeIPv6)
		ip := f[ethHeaderBytes:]
		binary.BigEndian.PutUint32(ip[0:4], 6<<28)
		binary.BigEndian.PutUint16(ip[4:6], uint16(ulen))
		ip[6] = protoUDP
		ip[7] = ipTTLHops
		s16, d16 := sa.As16(), da.As16()
		copy(ip[8:24], s16[:])
		copy(ip[24:40], d16[:])
		pseudo = checksumAdd(0, ip[8:40])
		udp = ip[ipv6HeaderBytes:]
	} else {
		binary.BigEndian.PutUint16(f[12:14], etherTypeIPv4)
		ip := f[ethHeaderBytes:]
		ip[0] = 0x45
		ip[1] = 0
		binary.BigEndian.PutUint16(ip[2:4], uint16(ipv4HeaderBytes+ulen))
		binary.BigEndian.PutUint16(ip[4:6], ipID)
		binary.BigEndian.PutUint16(ip[6:8], 0x4000) // don't fragment
		ip[8] = ipTTLHops
		ip[9] = protoUDP
		ip[10], ip[11] = 0, 0
		s4, d4 := sa.As4(), da.As4()
		copy(ip[12:16], s4[:])
		copy(ip[16:20], d4[:])
		binary.BigEndian.PutUint16(ip[10:12], ^checksumFold(checksumAdd(0, ip[:ipv4HeaderBytes])))
		pseudo = checksumAdd(0, ip[12:20])
		udp = ip[ipv4HeaderBytes:]
	}
	binary.BigEndian.PutUint16(udp[0:2], src.Port())
	binary.BigEndian.PutUint16(udp[2:4], dst.Port())
	binary.BigEndian.PutUint16(udp[4:6], uint16(ulen))
	udp[6], udp[7] = 0, 0
	copy(udp[udpHeaderBytes:], payload)
	pseudo += uint32(protoUDP) + uint32(ulen)
	csum := ^checksumFold(checksumAdd(pseudo, udp[:ulen]))
	if csum == 0 {
		csum = 0xffff // 0 means "no checksum" (IPv4) or is invalid (IPv6)
	}
	binary.BigEndian.PutUint16(udp[6:8], csum)
	return n
}

// checksumAdd adds b, as big-endian 16-bit words (odd tail padded with
// zero), to the ones-complement accumulator sum. The accumulator is wide
// enough for any frame: fold only at the end.
func checksumAdd(sum uint32, b []byte) uint32 {
	s := uint64(sum)
	for len(b) >= 8 {
		s += uint64(binary.BigEndian.Uint32(b[0:4])) + uint64(binary.BigEndian.Uint32(b[4:8]))
		b = b[8:]
	}
	for len(b) >= 2 {
		s += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 8
	}
	for s>>32 != 0 {
		s = s&0xffffffff + s>>32
	}
	// Fold the 32-bit words' carries into 16 bits later; keep 32 here.
	return uint32(s)
}

// checksumFold folds a ones-complement accumulator to 16 bits.
func checksumFold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}
