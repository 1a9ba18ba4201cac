package afxdp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Open is the "auto" transport: an XDPConn for cfg if AF_XDP works here,
// else a kernel UDPConn on the same address and port. fallback is nil when
// AF_XDP is in use, and otherwise says why not (log it). An invalid cfg is
// an error, never a fallback. An empty cfg.Interface means the interface
// that holds cfg.Addr; when no interface holds it (an unspecified address,
// say), Open falls back to UDP and says so.
func Open(cfg Config) (conn Conn, fallback error, err error) {
	if cfg.Interface == "" {
		name, herr := interfaceHolding(cfg.Addr)
		if herr != nil {
			why := fmt.Errorf("afxdp: no interface configured, and %w", herr)
			if !cfg.Addr.IsValid() || cfg.Port == 0 {
				return nil, nil, configErr("auto transport needs addr and port (got %v, %d)", cfg.Addr, cfg.Port)
			}
			u, uerr := NewUDP(netip.AddrPortFrom(cfg.Addr, cfg.Port), UDPOptions{SocketBufferBytes: ConsensusSocketBufferBytes})
			if uerr != nil {
				return nil, nil, fmt.Errorf("%v; the udp fallback failed: %w", why, uerr)
			}
			return u, why, nil
		}
		cfg.Interface = name
	}
	full, err := cfg.withDefaults()
	if err != nil {
		return nil, nil, err
	}
	x, xerr := NewXDP(full)
	if xerr == nil {
		return x, nil, nil
	}
	if errors.Is(xerr, ErrInvalidConfig) {
		return nil, nil, xerr
	}
	addr := full.Addr
	if !addr.IsValid() {
		addr = netip.IPv4Unspecified()
		if ifi, ierr := net.InterfaceByName(full.Interface); ierr == nil {
			if a, aerr := interfaceAddr(ifi); aerr == nil {
				addr = a
			}
		}
	}
	u, uerr := NewUDP(netip.AddrPortFrom(addr, full.Port), UDPOptions{SocketBufferBytes: ConsensusSocketBufferBytes})
	if uerr != nil {
		return nil, nil, fmt.Errorf("afxdp: AF_XDP unavailable (%v), and the udp fallback failed: %w", xerr, uerr)
	}
	return u, xerr, nil
}

// Transport kinds, as kvnode's config names them.
const (
	TransportAFXDP = "afxdp" // NewXDP; failing is an error that says why
	TransportUDP   = "udp"   // NewUDP on cfg.Addr:cfg.Port
	TransportAuto  = "auto"  // Open: AF_XDP, else UDP with the reason
)

// OpenTransport opens the Conn kind names. For TransportUDP only
// cfg.Addr (required) and cfg.Port are used. fallback is non-nil only for
// TransportAuto when it fell back to UDP.
func OpenTransport(kind string, cfg Config) (conn Conn, fallback error, err error) {
	switch kind {
	case TransportAFXDP:
		x, err := NewXDP(cfg)
		if err != nil {
			return nil, nil, err
		}
		return x, nil, nil
	case TransportUDP:
		if !cfg.Addr.IsValid() || cfg.Port == 0 {
			return nil, nil, configErr("udp transport needs addr and port (got %v, %d)", cfg.Addr, cfg.Port)
		}
		u, err := NewUDP(netip.AddrPortFrom(cfg.Addr, cfg.Port), UDPOptions{SocketBufferBytes: ConsensusSocketBufferBytes})
		if err != nil {
			return nil, nil, err
		}
		return u, nil, nil
	case TransportAuto:
		return Open(cfg)
	}
	return nil, nil, configErr("transport %q: want %q, %q or %q", kind, TransportAFXDP, TransportUDP, TransportAuto)
}

// interfaceHolding names the network interface one of whose addresses is
// addr.
func interfaceHolding(addr netip.Addr) (string, error) {
	if !addr.IsValid() || addr.IsUnspecified() {
		return "", fmt.Errorf("the address %v names no interface", addr)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("listing interfaces: %w", err)
	}
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if pfx, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(pfx.IP); ok && ip.Unmap() == addr.Unmap() {
					return ifi.Name, nil
				}
			}
		}
	}
	return "", fmt.Errorf("no interface holds %v", addr)
}
