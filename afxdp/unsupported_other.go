//go:build !linux

package afxdp

import "net/netip"

// unsupportedConn makes the Linux-only types satisfy Conn elsewhere.
type unsupportedConn struct{}

func (unsupportedConn) ReadBatch([]Packet) (int, error)  { return 0, ErrNotSupported }
func (unsupportedConn) WriteBatch([]Packet) (int, error) { return 0, ErrNotSupported }
func (unsupportedConn) BatchSize() int                   { return 1 }
func (unsupportedConn) MaxPayload() int                  { return 0 }
func (unsupportedConn) LocalAddr() netip.AddrPort        { return netip.AddrPort{} }
func (unsupportedConn) Close() error                     { return nil }

// Stats returns zero counters.
func (unsupportedConn) Stats() Counters { return Counters{} }
