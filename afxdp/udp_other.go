//go:build !linux

package afxdp

import (
	"fmt"
	"net/netip"
)

// UDPConn is the kernel UDP Conn; recvmmsg/sendmmsg batching exists only
// on Linux.
type UDPConn struct{ unsupportedConn }

var _ Conn = (*UDPConn)(nil)

// NewUDP returns an error wrapping ErrNotSupported off Linux.
func NewUDP(addr netip.AddrPort, opts UDPOptions) (*UDPConn, error) {
	return nil, fmt.Errorf("afxdp: batched udp: %w", ErrNotSupported)
}
