//go:build !linux

// Package netns builds throwaway network namespaces (Linux only).
package netns

import (
	"fmt"
	"net/netip"
	"time"

	"synod/afxdp"
)

// Pair is two namespaces joined by a veth pair.
type Pair struct {
	NS    [2]string
	If    [2]string
	Addr4 [2]netip.Addr
	Addr6 [2]netip.Addr
}

// Available reports that namespaces do not exist here.
func Available() error { return fmt.Errorf("netns: %w", afxdp.ErrNotSupported) }

// NewPair returns an error wrapping afxdp.ErrNotSupported.
func NewPair(name string, subnet int) (*Pair, error) { return nil, Available() }

// Close does nothing.
func (p *Pair) Close() error { return nil }

// Exec returns an error wrapping afxdp.ErrNotSupported.
func Exec(ns string, args ...string) (string, error) { return "", Available() }

// Run returns an error wrapping afxdp.ErrNotSupported.
func Run(ns string, f func() error) error { return Available() }

// Ping returns an error wrapping afxdp.ErrNotSupported.
func Ping(ns string, dst netip.Addr, timeout time.Duration) error { return Available() }

// LAN is n node namespaces on one Ethernet segment (Linux only).
type LAN struct {
	Hub   string
	NS    []string
	If    []string
	Addr4 []netip.Addr
	Addr6 []netip.Addr
}

// NewLAN returns an error wrapping afxdp.ErrNotSupported.
func NewLAN(name string, subnet, n int) (*LAN, error) { return nil, Available() }

// Close does nothing.
func (l *LAN) Close() error { return nil }

// AddHostLink returns an error wrapping afxdp.ErrNotSupported.
func (l *LAN) AddHostLink(name string, host netip.Prefix) (remove func() error, err error) {
	return nil, Available()
}
