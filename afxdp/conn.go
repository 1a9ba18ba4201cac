// Package afxdp moves consensus datagrams between replicas behind one batch
// interface, Conn, in the manner of wireguard-go's conn.Bind. It never parses
// consensus messages: payloads are opaque bytes.
package afxdp

import (
	"errors"
	"net/netip"
)

// Packet is one datagram: Buf holds the payload (N bytes of it are valid)
// and Addr is the remote UDP endpoint (source on read, destination on
// write).
type Packet struct {
	Buf  []byte
	N    int
	Addr netip.AddrPort
}

// Conn is a batch datagram socket. Implementations: the AF_XDP socket, the
// kernel UDP socket (recvmmsg/sendmmsg) and an in-memory double for tests.
//
// ReadBatch and WriteBatch may be called concurrently with each other, but
// each by one goroutine at a time.
type Conn interface {
	// ReadBatch blocks until at least one datagram arrives (or the Conn is
	// closed, returning ErrClosed), then fills up to len(pkts) packets,
	// copying each payload into pkts[i].Buf and setting N and Addr. It
	// returns the number filled.
	ReadBatch(pkts []Packet) (int, error)
	// WriteBatch sends pkts[i].Buf[:pkts[i].N] to pkts[i].Addr for each i
	// and returns how many were handed to the network. It keeps no
	// reference to any Buf once it returns: the caller may reuse them
	// (kv/replica's send loop seals every datagram of a batch into one
	// buffer it reuses for the next).
	WriteBatch(pkts []Packet) (int, error)
	// BatchSize is the largest batch worth passing to ReadBatch/WriteBatch.
	BatchSize() int
	// MaxPayload is the largest datagram payload this Conn carries; larger
	// messages go over the TCP side channel.
	MaxPayload() int
	// LocalAddr is the UDP endpoint this Conn receives on.
	LocalAddr() netip.AddrPort
	// Close stops the Conn; blocked calls return ErrClosed.
	Close() error
}

// ErrClosed is returned by a Conn after Close.
var ErrClosed = errors.New("afxdp: conn closed")

// ErrNotSupported is wrapped by errors on platforms or kernels that lack a
// feature.
var ErrNotSupported = errors.New("afxdp: not supported")

// ErrPayloadTooLarge is returned by WriteBatch for a packet whose N exceeds
// MaxPayload; the packets before it were sent.
var ErrPayloadTooLarge = errors.New("afxdp: payload larger than MaxPayload")
