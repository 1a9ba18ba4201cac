package afxdp

import (
	"fmt"
	"net/netip"
)

// Limits of the kernel UDP Conn.
const (
	udpBatchPacketsDefault = 64
	udpBatchPacketsMax     = 1024
	// udpPayloadBytesDefault fits one IPv6 datagram in a 1500-byte MTU.
	udpPayloadBytesDefault = 1452
	udpPayloadBytesMax     = 65507
	// udpSocketBufferBytesMax bounds SO_RCVBUF/SO_SNDBUF requests.
	udpSocketBufferBytesMax = 64 << 20
)

// ConsensusSocketBufferBytes is the receive and send buffer the consensus
// transport asks for on its UDP socket (the kernel's default, rmem_default,
// is often 208 KiB: about 90 small datagrams). Linux caps the request at
// net.core.rmem_max and wmem_max without an error; ReceiveBufferBytes says
// what was granted.
const ConsensusSocketBufferBytes = 4 << 20

// UDPOptions configures NewUDP. The zero value is valid: defaults apply.
type UDPOptions struct {
	// BatchSize is the most datagrams one recvmmsg/sendmmsg moves
	// (default 64, at most 1024).
	BatchSize int
	// MaxPayload is the largest datagram payload written (default 1452,
	// at most 65507).
	MaxPayload int
	// SocketBufferBytes sets SO_RCVBUF and SO_SNDBUF when > 0 (at most
	// 64 MiB).
	SocketBufferBytes int
}

func (o *UDPOptions) withDefaults() (UDPOptions, error) {
	r := *o
	if r.BatchSize == 0 {
		r.BatchSize = udpBatchPacketsDefault
	}
	if r.MaxPayload == 0 {
		r.MaxPayload = udpPayloadBytesDefault
	}
	if r.BatchSize < 1 || r.BatchSize > udpBatchPacketsMax {
		return r, fmt.Errorf("afxdp: udp batch size %d out of range 1..%d", r.BatchSize, udpBatchPacketsMax)
	}
	if r.MaxPayload < 1 || r.MaxPayload > udpPayloadBytesMax {
		return r, fmt.Errorf("afxdp: udp max payload %d out of range 1..%d", r.MaxPayload, udpPayloadBytesMax)
	}
	if r.SocketBufferBytes < 0 || r.SocketBufferBytes > udpSocketBufferBytesMax {
		return r, fmt.Errorf("afxdp: udp socket buffer %d out of range 0..%d", r.SocketBufferBytes, udpSocketBufferBytesMax)
	}
	return r, nil
}

// validUDPAddr rejects addresses a socket cannot bind.
func validUDPAddr(addr netip.AddrPort) error {
	if !addr.IsValid() {
		return fmt.Errorf("afxdp: invalid udp address %v", addr)
	}
	return nil
}
