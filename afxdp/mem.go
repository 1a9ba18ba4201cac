package afxdp

import (
	"net/netip"
	"sync"
	"sync/atomic"
)

// Limits of the in-memory network.
const (
	// memQueuePackets is how many datagrams wait in a MemConn's receive
	// queue; more are dropped, as a full kernel socket buffer would.
	memQueuePackets = 4096
	// memBatchPackets is the BatchSize of a MemConn.
	memBatchPackets = 64
	// memPayloadBytesMax is the MaxPayload of a MemConn (one UDP datagram
	// over Ethernet with a 1500-byte MTU and IPv6).
	memPayloadBytesMax = 1452
)

// DropFunc decides whether the datagram from -> to is lost. It is called
// with the network's lock held and must not call back into the network.
type DropFunc func(from, to netip.AddrPort, payload []byte) bool

// MemNetwork is an in-memory datagram network for tests: Conns created by
// Listen deliver to one another by address. Faults are injected with
// Partition/Isolate (symmetric, by endpoint) and SetDropFunc (arbitrary,
// e.g. seeded random loss). Delivery order between two endpoints is FIFO.
type MemNetwork struct {
	mu        sync.Mutex
	conns     map[netip.AddrPort]*MemConn
	blocked   map[[2]netip.AddrPort]bool // unordered pair, smaller first
	isolated  map[netip.AddrPort]bool
	drop      DropFunc
	delivered atomic.Uint64
	dropped   atomic.Uint64
}

// NewMemNetwork returns an empty network with no faults.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{
		conns:    make(map[netip.AddrPort]*MemConn),
		blocked:  make(map[[2]netip.AddrPort]bool),
		isolated: make(map[netip.AddrPort]bool),
	}
}

// Listen returns a Conn receiving on addr. Listening again on an address
// closes the previous Conn there and takes its place (a restarted node).
func (n *MemNetwork) Listen(addr netip.AddrPort) Conn {
	c := &MemConn{
		net:   n,
		addr:  addr,
		queue: make(chan memDatagram, memQueuePackets),
		done:  make(chan struct{}),
	}
	n.mu.Lock()
	old := n.conns[addr]
	n.conns[addr] = c
	n.mu.Unlock()
	if old != nil {
		old.closeLocal()
	}
	return c
}

func pairKey(a, b netip.AddrPort) [2]netip.AddrPort {
	if b.Compare(a) < 0 {
		a, b = b, a
	}
	return [2]netip.AddrPort{a, b}
}

// Partition drops all datagrams between a and b, both directions, until
// Heal(a, b) or HealAll.
func (n *MemNetwork) Partition(a, b netip.AddrPort) {
	n.mu.Lock()
	n.blocked[pairKey(a, b)] = true
	n.mu.Unlock()
}

// Heal undoes Partition(a, b).
func (n *MemNetwork) Heal(a, b netip.AddrPort) {
	n.mu.Lock()
	delete(n.blocked, pairKey(a, b))
	n.mu.Unlock()
}

// Isolate drops every datagram to or from a until HealAll or Rejoin(a).
func (n *MemNetwork) Isolate(a netip.AddrPort) {
	n.mu.Lock()
	n.isolated[a] = true
	n.mu.Unlock()
}

// Rejoin undoes Isolate(a).
func (n *MemNetwork) Rejoin(a netip.AddrPort) {
	n.mu.Lock()
	delete(n.isolated, a)
	n.mu.Unlock()
}

// HealAll removes every partition and isolation (not the DropFunc).
func (n *MemNetwork) HealAll() {
	n.mu.Lock()
	clear(n.blocked)
	clear(n.isolated)
	n.mu.Unlock()
}

// SetDropFunc installs f (nil removes it); it is consulted for every
// datagram not already dropped by a partition.
func (n *MemNetwork) SetDropFunc(f DropFunc) {
	n.mu.Lock()
	n.drop = f
	n.mu.Unlock()
}

// Stats returns how many datagrams were delivered to a receive queue and
// how many were dropped (faults, unknown address, full queue).
func (n *MemNetwork) Stats() (delivered, dropped uint64) {
	return n.delivered.Load(), n.dropped.Load()
}

// send delivers a copy of payload from -> to, or drops it.
func (n *MemNetwork) send(from, to netip.AddrPort, payload []byte) {
	n.mu.Lock()
	dst := n.conns[to]
	lost := dst == nil || n.isolated[from] || n.isolated[to] ||
		n.blocked[pairKey(from, to)] ||
		(n.drop != nil && n.drop(from, to, payload))
	n.mu.Unlock()
	if lost {
		n.dropped.Add(1)
		return
	}
	d := memDatagram{from: from, payload: append([]byte(nil), payload...)}
	select {
	case dst.queue <- d:
		n.delivered.Add(1)
	default:
		n.dropped.Add(1)
	}
}

type memDatagram struct {
	from    netip.AddrPort
	payload []byte
}

// MemConn is the Conn returned by MemNetwork.Listen.
type MemConn struct {
	net       *MemNetwork
	addr      netip.AddrPort
	queue     chan memDatagram
	done      chan struct{}
	closeOnce sync.Once
}

var _ Conn = (*MemConn)(nil)

// ReadBatch implements Conn. A payload longer than pkts[i].Buf is
// truncated to it.
func (c *MemConn) ReadBatch(pkts []Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	select {
	case <-c.done:
		return 0, ErrClosed
	case d := <-c.queue:
		c.fill(&pkts[0], d)
	}
	n := 1
	for n < len(pkts) {
		select {
		case d := <-c.queue:
			c.fill(&pkts[n], d)
			n++
		default:
			return n, nil
		}
	}
	return n, nil
}

func (c *MemConn) fill(p *Packet, d memDatagram) {
	p.N = copy(p.Buf, d.payload)
	p.Addr = d.from
}

// WriteBatch implements Conn.
func (c *MemConn) WriteBatch(pkts []Packet) (int, error) {
	select {
	case <-c.done:
		return 0, ErrClosed
	default:
	}
	for i := range pkts {
		if pkts[i].N > memPayloadBytesMax || pkts[i].N > len(pkts[i].Buf) {
			return i, ErrPayloadTooLarge
		}
		c.net.send(c.addr, pkts[i].Addr, pkts[i].Buf[:pkts[i].N])
	}
	return len(pkts), nil
}

// BatchSize implements Conn.
func (c *MemConn) BatchSize() int { return memBatchPackets }

// MaxPayload implements Conn.
func (c *MemConn) MaxPayload() int { return memPayloadBytesMax }

// LocalAddr implements Conn.
func (c *MemConn) LocalAddr() netip.AddrPort { return c.addr }

// Close implements Conn: the address is freed and blocked reads return
// ErrClosed.
func (c *MemConn) Close() error {
	c.net.mu.Lock()
	if c.net.conns[c.addr] == c {
		delete(c.net.conns, c.addr)
	}
	c.net.mu.Unlock()
	c.closeLocal()
	return nil
}

func (c *MemConn) closeLocal() {
	c.closeOnce.Do(func() { close(c.done) })
}
