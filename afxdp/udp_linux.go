package afxdp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// UDPConn is a Conn on a kernel UDP socket, moving batches with
// recvmmsg/sendmmsg. It waits in Go's netpoller, so a blocked ReadBatch
// costs no CPU. An IPv4 UDPConn talks to IPv4 peers, an IPv6 one to IPv6
// peers (IPv4-mapped addresses are unmapped on read).
type UDPConn struct {
	opts  UDPOptions
	uc    *net.UDPConn
	raw   syscall.RawConn
	local netip.AddrPort
	v6    bool
	ctr   counters

	rmu sync.Mutex // guards rx*, one reader at a time
	rx  mmsgBatch
	wmu sync.Mutex // guards tx*, one writer at a time
	tx  mmsgBatch
}

var _ Conn = (*UDPConn)(nil)

// mmsgBatch is the preallocated syscall state for one direction.
type mmsgBatch struct {
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6 // large enough for either family
}

func newMmsgBatch(n int) mmsgBatch {
	return mmsgBatch{
		hdrs:  make([]unix.Mmsghdr, n),
		iovs:  make([]unix.Iovec, n),
		names: make([]unix.RawSockaddrInet6, n),
	}
}

// NewUDP binds a kernel UDP socket at addr (port 0 picks one; LocalAddr
// reports it).
func NewUDP(addr netip.AddrPort, opts UDPOptions) (*UDPConn, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := validUDPAddr(addr); err != nil {
		return nil, err
	}
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	network := "udp4"
	if addr.Addr().Is6() {
		network = "udp6"
	}
	uc, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, fmt.Errorf("afxdp: binding udp %v: %w", addr, err)
	}
	if o.SocketBufferBytes > 0 {
		if err := uc.SetReadBuffer(o.SocketBufferBytes); err != nil {
			uc.Close()
			return nil, fmt.Errorf("afxdp: setting receive buffer: %w", err)
		}
		if err := uc.SetWriteBuffer(o.SocketBufferBytes); err != nil {
			uc.Close()
			return nil, fmt.Errorf("afxdp: setting send buffer: %w", err)
		}
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("afxdp: getting raw udp conn: %w", err)
	}
	local := uc.LocalAddr().(*net.UDPAddr).AddrPort()
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	return &UDPConn{
		opts:  o,
		uc:    uc,
		raw:   raw,
		local: local,
		v6:    addr.Addr().Is6(),
		rx:    newMmsgBatch(o.BatchSize),
		tx:    newMmsgBatch(o.BatchSize),
	}, nil
}

// ReadBatch implements Conn. A datagram longer than its pkts[i].Buf is
// counted in RxTruncated and dropped.
func (c *UDPConn) ReadBatch(pkts []Packet) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		n, err := c.readOnce(pkts, true)
		if err != nil || n > 0 {
			return n, err
		}
		// Every datagram of the batch was dropped as truncated: wait again.
	}
}

// readNonblock is one recvmmsg that does not wait: 0 when nothing is
// queued. The caller holds no lock; it takes rmu.
func (c *UDPConn) readNonblock(pkts []Packet) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	return c.readOnce(pkts, false)
}

// readOnce is one recvmmsg; with block it waits in the netpoller until
// something is queued.
func (c *UDPConn) readOnce(pkts []Packet, block bool) (int, error) {
	want := min(len(pkts), c.opts.BatchSize)
	if want == 0 {
		return 0, nil
	}
	b := &c.rx
	for i := 0; i < want; i++ {
		buf := pkts[i].Buf
		b.iovs[i] = unix.Iovec{}
		if len(buf) > 0 {
			b.iovs[i].Base = &buf[0]
		}
		b.iovs[i].SetLen(len(buf))
		b.hdrs[i] = unix.Mmsghdr{}
		b.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		b.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		b.hdrs[i].Hdr.Iov = &b.iovs[i]
		b.hdrs[i].Hdr.SetIovlen(1)
	}
	var got int
	var serr error
	err := c.raw.Read(func(fd uintptr) bool {
		r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.hdrs[0])),
			uintptr(want), unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EAGAIN {
			return !block
		}
		if e != 0 {
			serr = e
		} else {
			got = int(r)
		}
		return true
	})
	if err != nil {
		return 0, mapClosed(err)
	}
	if serr != nil {
		return 0, fmt.Errorf("afxdp: recvmmsg: %w", serr)
	}
	out := 0
	for i := 0; i < got; i++ {
		h := &b.hdrs[i]
		if h.Hdr.Flags&unix.MSG_TRUNC != 0 {
			c.ctr.rxTruncated.Add(1)
			continue
		}
		from, ok := decodeSockaddr(&b.names[i])
		if !ok {
			c.ctr.rxForeign.Add(1)
			continue
		}
		// Keep the caller's buffers: swap rather than copy when compacting.
		if out != i {
			pkts[out], pkts[i] = pkts[i], pkts[out]
		}
		pkts[out].N = int(h.Len)
		pkts[out].Addr = from
		c.ctr.rxPackets.Add(1)
		c.ctr.rxBytes.Add(uint64(h.Len))
		out++
	}
	return out, nil
}

// WriteBatch implements Conn. It returns after every packet was handed to
// the kernel, or at the first packet it cannot send (too large, wrong
// address family, socket error) with the count before it.
func (c *UDPConn) WriteBatch(pkts []Packet) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	sent := 0
	for sent < len(pkts) {
		n, err := c.writeOnce(pkts[sent:])
		sent += n
		if err != nil {
			return sent, err
		}
	}
	return sent, nil
}

func (c *UDPConn) writeOnce(pkts []Packet) (int, error) {
	b := &c.tx
	want := 0
	var badErr error
	for ; want < len(pkts) && want < c.opts.BatchSize; want++ {
		p := &pkts[want]
		if p.N > c.opts.MaxPayload || p.N > len(p.Buf) || p.N < 0 {
			badErr = ErrPayloadTooLarge
			break
		}
		nameLen, ok := encodeSockaddr(&b.names[want], p.Addr, c.v6)
		if !ok {
			badErr = fmt.Errorf("afxdp: udp conn on %v cannot send to %v", c.local, p.Addr)
			break
		}
		b.iovs[want] = unix.Iovec{}
		if p.N > 0 {
			b.iovs[want].Base = &p.Buf[0]
		}
		b.iovs[want].SetLen(p.N)
		b.hdrs[want] = unix.Mmsghdr{}
		b.hdrs[want].Hdr.Name = (*byte)(unsafe.Pointer(&b.names[want]))
		b.hdrs[want].Hdr.Namelen = nameLen
		b.hdrs[want].Hdr.Iov = &b.iovs[want]
		b.hdrs[want].Hdr.SetIovlen(1)
	}
	if want == 0 {
		return 0, badErr
	}
	var got int
	var serr error
	err := c.raw.Write(func(fd uintptr) bool {
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&b.hdrs[0])),
			uintptr(want), unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EAGAIN {
			return false
		}
		if e != 0 {
			serr = e
		} else {
			got = int(r)
		}
		return true
	})
	if err != nil {
		return 0, mapClosed(err)
	}
	for i := 0; i < got; i++ {
		c.ctr.txPackets.Add(1)
		c.ctr.txBytes.Add(uint64(pkts[i].N))
	}
	if serr != nil {
		return got, fmt.Errorf("afxdp: sendmmsg: %w", serr)
	}
	if got == want && badErr != nil {
		return got, badErr
	}
	return got, nil
}

// fd returns the socket's descriptor (valid until Close).
func (c *UDPConn) fd() int {
	fd := -1
	c.raw.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// BatchSize implements Conn.
func (c *UDPConn) BatchSize() int { return c.opts.BatchSize }

// MaxPayload implements Conn.
func (c *UDPConn) MaxPayload() int { return c.opts.MaxPayload }

// LocalAddr implements Conn.
func (c *UDPConn) LocalAddr() netip.AddrPort { return c.local }

// Stats returns a snapshot of the packet counters.
func (c *UDPConn) Stats() Counters { return c.ctr.snapshot() }

// Close implements Conn.
func (c *UDPConn) Close() error {
	if err := c.uc.Close(); err != nil {
		return mapClosed(err)
	}
	return nil
}

func mapClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return ErrClosed
	}
	return err
}

// encodeSockaddr writes addr as a raw sockaddr for a socket of family v6
// and returns its length; ok is false for a family mismatch.
func encodeSockaddr(dst *unix.RawSockaddrInet6, addr netip.AddrPort, v6 bool) (uint32, bool) {
	ip := addr.Addr()
	port := addr.Port()
	if v6 {
		if !ip.Is6() || ip.Is4In6() {
			return 0, false
		}
		*dst = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: ip.As16()}
		putPort(&dst.Port, port)
		if z := ip.Zone(); z != "" {
			if ifi, err := net.InterfaceByName(z); err == nil {
				dst.Scope_id = uint32(ifi.Index)
			}
		}
		return unix.SizeofSockaddrInet6, true
	}
	ip = ip.Unmap()
	if !ip.Is4() {
		return 0, false
	}
	sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(dst))
	*sa4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ip.As4()}
	putPort(&sa4.Port, port)
	return unix.SizeofSockaddrInet4, true
}

// decodeSockaddr reads a raw sockaddr filled by the kernel.
func decodeSockaddr(src *unix.RawSockaddrInet6) (netip.AddrPort, bool) {
	switch src.Family {
	case unix.AF_INET6:
		ip := netip.AddrFrom16(src.Addr).Unmap()
		return netip.AddrPortFrom(ip, getPort(&src.Port)), true
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(src))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), getPort(&sa4.Port)), true
	}
	return netip.AddrPort{}, false
}

// The sockaddr port field holds network byte order.
func putPort(p *uint16, port uint16) {
	b := (*[2]byte)(unsafe.Pointer(p))
	b[0], b[1] = byte(port>>8), byte(port)
}

func getPort(p *uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(p))
	return uint16(b[0])<<8 | uint16(b[1])
}
