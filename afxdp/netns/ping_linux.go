package netns

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Ping sends ICMP (or ICMPv6) echo requests from inside namespace ns to
// dst until one is answered or timeout passes. It uses a raw socket, so it
// needs no ping(8) binary (root only).
func Ping(ns string, dst netip.Addr, timeout time.Duration) error {
	return Run(ns, func() error { return ping(dst, timeout) })
}

func ping(dst netip.Addr, timeout time.Duration) error {
	dst = dst.Unmap()
	family, proto, echoReq, echoReply := unix.AF_INET, unix.IPPROTO_ICMP, byte(8), byte(0)
	var sa unix.Sockaddr
	if dst.Is4() {
		sa = &unix.SockaddrInet4{Addr: dst.As4()}
	} else {
		family, proto, echoReq, echoReply = unix.AF_INET6, unix.IPPROTO_ICMPV6, 128, 129
		sa = &unix.SockaddrInet6{Addr: dst.As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return fmt.Errorf("netns: ping socket: %w", err)
	}
	defer unix.Close(fd)
	id := uint16(os.Getpid())
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for seq := uint16(1); time.Now().Before(deadline); seq++ {
		msg := make([]byte, 16)
		msg[0] = echoReq
		binary.BigEndian.PutUint16(msg[4:6], id)
		binary.BigEndian.PutUint16(msg[6:8], seq)
		if !dst.Is6() { // the kernel fills in ICMPv6 checksums itself
			binary.BigEndian.PutUint16(msg[2:4], icmpChecksum(msg))
		}
		if err := unix.Sendto(fd, msg, 0, sa); err != nil {
			return fmt.Errorf("netns: ping %v: %w", dst, err)
		}
		tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		for {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				break // timeout: send the next request
			}
			icmp := buf[:n]
			if !dst.Is6() {
				if n < 20 || int(buf[0]&0x0f)*4 > n {
					continue
				}
				icmp = buf[int(buf[0]&0x0f)*4 : n]
			}
			if len(icmp) < 8 || icmp[0] != echoReply || binary.BigEndian.Uint16(icmp[4:6]) != id {
				continue
			}
			switch f := from.(type) {
			case *unix.SockaddrInet4:
				if netip.AddrFrom4(f.Addr) == dst {
					return nil
				}
			case *unix.SockaddrInet6:
				if netip.AddrFrom16(f.Addr) == dst {
					return nil
				}
			}
		}
	}
	return fmt.Errorf("netns: ping %v: no reply within %v", dst, timeout)
}

func icmpChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
