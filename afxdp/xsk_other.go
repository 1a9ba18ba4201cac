//go:build !linux

package afxdp

import (
	"fmt"
	"net"
	"net/netip"
)

// XDPConn is the AF_XDP Conn; AF_XDP exists only on Linux.
type XDPConn struct{ unsupportedConn }

var _ Conn = (*XDPConn)(nil)

// NewXDP returns an error wrapping ErrNotSupported off Linux (after
// validating cfg).
func NewXDP(cfg Config) (*XDPConn, error) {
	if _, err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("afxdp: AF_XDP: %w", ErrNotSupported)
}

func interfaceAddr(ifi *net.Interface) (netip.Addr, error) {
	return netip.Addr{}, fmt.Errorf("afxdp: interface addresses: %w", ErrNotSupported)
}

// AttachMode returns "".
func (*XDPConn) AttachMode() string { return "" }

// DisableTxChecksum returns an error wrapping ErrNotSupported off Linux.
func DisableTxChecksum(ifname string) error {
	return fmt.Errorf("afxdp: disabling tx checksum: %w", ErrNotSupported)
}

// SetTxChecksum returns an error wrapping ErrNotSupported off Linux.
func SetTxChecksum(ifname string, on bool) error {
	return fmt.Errorf("afxdp: setting tx checksum offload: %w", ErrNotSupported)
}
