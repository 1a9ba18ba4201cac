package afxdp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Timing limits of the AF_XDP Conn.
const (
	// bindRetryTotal bounds the EBUSY retries on bind: a socket of a
	// process that just died is released asynchronously.
	bindRetryTotal = 3 * time.Second
	bindRetryPause = 20 * time.Millisecond
	// pollTimeoutMillis bounds one poll(2) sleep (Close also wakes it
	// through an eventfd).
	pollTimeoutMillis = 1000
	// txStallTotal bounds how long WriteBatch waits for a free TX frame or
	// ring slot before it gives up with an error.
	txStallTotal = time.Second
	// shadowCheckSpins is how many empty RX ring polls pass between
	// non-blocking reads of the kernel socket while spinning.
	shadowCheckSpins = 1024
	// txKickTriesMax bounds the sendto kicks per flush; copy mode sends at
	// most a driver budget (32) of frames per kick.
	txKickTriesMax = 256
)

// XDPConn is a Conn on an AF_XDP socket bound to one interface queue. Its
// XDP program redirects UDP datagrams to Config.Port on that queue to the
// socket; everything else reaches the kernel as before.
//
// UMEM layout: FrameCount chunks of FrameBytes. Chunks [0, FrameCount/2)
// belong to the receive side (fill ring -> kernel -> RX ring -> back to the
// fill ring) and are touched only under rmu; chunks [FrameCount/2,
// FrameCount) belong to the transmit side (free list -> TX ring -> kernel
// -> completion ring -> free list), only under wmu. So ReadBatch and
// WriteBatch never share a frame or a ring.
type XDPConn struct {
	cfg        Config
	attached   string // AttachNative or AttachGeneric, as it ended up
	fd         int
	umem       []byte
	fill, comp *ring
	rx, tx     *ring
	xskmap     *ebpf.Map
	prog       *ebpf.Program
	link       link.Link
	ifindex    int
	srcMAC     [6]byte
	local      netip.AddrPort
	maxPayload int
	shadow     *UDPConn // kernel socket on our address: reserves the port, sends to unresolved peers, receives what XDP passes
	shadowFD   int
	neigh      *neighCache
	wakeFD     int // eventfd: Close wakes a poll(2) sleeper
	ctr        counters
	closed     atomic.Bool
	closeOnce  sync.Once
	closeErr   error

	rmu    sync.Mutex
	rxFree []uint64 // receive chunks not in the fill ring
	pinned bool

	wmu    sync.Mutex
	txFree []uint64 // transmit chunks not in flight
	ipID   uint16
	one    [1]Packet // scratch for shadow sends
}

var _ Conn = (*XDPConn)(nil)

// NewXDP opens an AF_XDP socket as cfg describes. Errors say which step
// failed and, for the usual causes (capabilities, RLIMIT_MEMLOCK, driver
// support, a busy queue), what to change. It must run in the network
// namespace of cfg.Interface; the returned Conn may be used from any
// thread.
func NewXDP(cfg Config) (_ *XDPConn, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkCores(cfg.Cores); err != nil {
		return nil, err
	}
	ifi, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("afxdp: finding interface %q: %w", cfg.Interface, err)
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("afxdp: interface %s is not Ethernet (hardware address %v)", ifi.Name, ifi.HardwareAddr)
	}
	if !cfg.Addr.IsValid() {
		if cfg.Addr, err = interfaceAddr(ifi); err != nil {
			return nil, err
		}
	}
	c := &XDPConn{cfg: cfg, fd: -1, wakeFD: -1, ifindex: ifi.Index}
	copy(c.srcMAC[:], ifi.HardwareAddr)
	c.local = netip.AddrPortFrom(cfg.Addr, cfg.Port)
	mtu := ifi.MTU
	if mtu <= 0 {
		mtu = mtuBytesDefault
	}
	v6 := cfg.Addr.Is6()
	ipUDP := frameOverheadBytes(v6) - ethHeaderBytes
	c.maxPayload = min(cfg.FrameBytes-xdpHeadroomBytes-frameOverheadBytes(v6), mtu-ipUDP)
	if c.maxPayload < 1 {
		return nil, fmt.Errorf("afxdp: interface %s MTU %d leaves no room for a payload", ifi.Name, mtu)
	}
	defer func() {
		if err != nil {
			c.teardown()
		}
	}()
	// The shadow socket first: it fails early and clearly if the port is
	// taken by another program.
	c.shadow, err = NewUDP(c.local, UDPOptions{BatchSize: 1, MaxPayload: c.maxPayload})
	if err != nil {
		return nil, fmt.Errorf("afxdp: reserving %v with a kernel udp socket: %w", c.local, err)
	}
	c.shadowFD = c.shadow.fd()
	if c.neigh, err = newNeighCache(c.ifindex); err != nil {
		return nil, fmt.Errorf("afxdp: %w", err)
	}
	if c.wakeFD, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return nil, fmt.Errorf("afxdp: creating eventfd: %w", err)
	}
	if err := c.openSocket(); err != nil {
		return nil, err
	}
	if err := c.bind(); err != nil {
		return nil, err
	}
	if err := c.attachProgram(); err != nil {
		return nil, err
	}
	return c, nil
}

// interfaceAddr picks the first IPv4, else the first global unicast IPv6,
// address of ifi.
func interfaceAddr(ifi *net.Interface) (netip.Addr, error) {
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("afxdp: listing addresses of %s: %w", ifi.Name, err)
	}
	var v6 netip.Addr
	for _, a := range addrs {
		pfx, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(pfx.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() {
			return ip, nil
		}
		if ip.IsGlobalUnicast() && !v6.IsValid() {
			v6 = ip
		}
	}
	if v6.IsValid() {
		return v6, nil
	}
	return netip.Addr{}, fmt.Errorf("afxdp: interface %s has no IPv4 or global IPv6 address: set addr", ifi.Name)
}

func checkCores(cores []int) error {
	if len(cores) == 0 {
		return nil
	}
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return fmt.Errorf("afxdp: reading cpu affinity: %w", err)
	}
	for _, cpu := range cores {
		if cpu >= cpuSetSizeMax || !allowed.IsSet(cpu) {
			return configErr("core %d is not available to this process (%d cpus allowed)", cpu, allowed.Count())
		}
	}
	return nil
}

func isPermission(err error) bool {
	return errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)
}

const capabilityHint = "run as root, or grant cap_net_raw,cap_net_admin,cap_bpf,cap_ipc_lock"

// openSocket creates the socket, registers the UMEM and maps the rings.
func (c *XDPConn) openSocket() error {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.EAFNOSUPPORT):
		return fmt.Errorf("afxdp: creating AF_XDP socket: %w: %w (kernel built without CONFIG_XDP_SOCKETS; use transport udp)", ErrNotSupported, err)
	case isPermission(err):
		return fmt.Errorf("afxdp: creating AF_XDP socket: %w (%s)", err, capabilityHint)
	case err != nil:
		return fmt.Errorf("afxdp: creating AF_XDP socket: %w", err)
	}
	c.fd = fd
	cfg := c.cfg
	umemBytes := cfg.FrameBytes * cfg.FrameCount
	c.umem, err = unix.Mmap(-1, 0, umemBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("afxdp: allocating %d-byte UMEM: %w", umemBytes, err)
	}
	reg := unix.XDPUmemReg{
		Addr: uint64(uintptr(unsafe.Pointer(&c.umem[0]))),
		Len:  uint64(umemBytes),
		Size: uint32(cfg.FrameBytes),
	}
	if err := setsockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		if errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM) {
			var lim unix.Rlimit
			unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim)
			return fmt.Errorf("afxdp: registering %d-byte UMEM: %w: it exceeds RLIMIT_MEMLOCK (soft limit %d bytes); "+
				"raise it (ulimit -l unlimited, systemd LimitMEMLOCK=infinity), grant CAP_IPC_LOCK, or lower frame_count", umemBytes, err, lim.Cur)
		}
		if isPermission(err) {
			return fmt.Errorf("afxdp: registering UMEM: %w (%s)", err, capabilityHint)
		}
		return fmt.Errorf("afxdp: registering UMEM: %w", err)
	}
	half := uint32(cfg.FrameCount / 2)
	for _, opt := range []int{unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_RX_RING, unix.XDP_TX_RING} {
		if err := unix.SetsockoptInt(fd, unix.SOL_XDP, opt, int(half)); err != nil {
			return fmt.Errorf("afxdp: sizing ring %d to %d entries: %w", opt, half, err)
		}
	}
	var off unix.XDPMmapOffsets
	if err := getsockopt(fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off)); err != nil {
		return fmt.Errorf("afxdp: reading ring offsets: %w", err)
	}
	descBytes := unsafe.Sizeof(unix.XDPDesc{})
	if c.rx, err = mapRing(fd, off.Rx, unix.XDP_PGOFF_RX_RING, half, descBytes); err != nil {
		return fmt.Errorf("afxdp: rx: %w", err)
	}
	if c.tx, err = mapRing(fd, off.Tx, unix.XDP_PGOFF_TX_RING, half, descBytes); err != nil {
		return fmt.Errorf("afxdp: tx: %w", err)
	}
	if c.fill, err = mapRing(fd, off.Fr, unix.XDP_UMEM_PGOFF_FILL_RING, half, 8); err != nil {
		return fmt.Errorf("afxdp: fill: %w", err)
	}
	if c.comp, err = mapRing(fd, off.Cr, unix.XDP_UMEM_PGOFF_COMPLETION_RING, half, 8); err != nil {
		return fmt.Errorf("afxdp: completion: %w", err)
	}
	fb := uint64(cfg.FrameBytes)
	c.rxFree = make([]uint64, 0, half)
	c.txFree = make([]uint64, 0, half)
	for i := uint64(0); i < uint64(half); i++ {
		c.rxFree = append(c.rxFree, i*fb)
		c.txFree = append(c.txFree, (uint64(half)+i)*fb)
	}
	c.refill()
	return nil
}

// bind binds the socket to the interface queue, retrying EBUSY for a
// bounded time.
func (c *XDPConn) bind() error {
	flags := uint16(unix.XDP_USE_NEED_WAKEUP | unix.XDP_COPY)
	if c.cfg.ZeroCopy {
		flags = unix.XDP_USE_NEED_WAKEUP | unix.XDP_ZEROCOPY
	}
	sa := &unix.SockaddrXDP{Flags: flags, Ifindex: uint32(c.ifindex), QueueID: uint32(c.cfg.QueueID)}
	deadline := time.Now().Add(bindRetryTotal)
	for {
		err := unix.Bind(c.fd, sa)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EBUSY) && time.Now().Before(deadline):
			time.Sleep(bindRetryPause)
			continue
		case errors.Is(err, unix.EBUSY):
			return fmt.Errorf("afxdp: binding %s queue %d: %w after %v (another AF_XDP socket holds this queue)", c.cfg.Interface, c.cfg.QueueID, err, bindRetryTotal)
		case c.cfg.ZeroCopy && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPROTONOSUPPORT)):
			return fmt.Errorf("afxdp: binding %s queue %d: %w: %w (driver has no zero-copy AF_XDP; set zero_copy = false)", c.cfg.Interface, c.cfg.QueueID, ErrNotSupported, err)
		case errors.Is(err, unix.EINVAL):
			return fmt.Errorf("afxdp: binding %s queue %d: %w (queue beyond the interface's queue count?)", c.cfg.Interface, c.cfg.QueueID, err)
		default:
			return fmt.Errorf("afxdp: binding %s queue %d: %w", c.cfg.Interface, c.cfg.QueueID, err)
		}
	}
}

// attachProgram loads the redirect program, attaches it (native, or
// generic as configured or as fallback) and registers the socket in the
// XSKMAP.
func (c *XDPConn) attachProgram() error {
	var err error
	if c.xskmap, c.prog, err = loadRedirect(c.cfg.Port); err != nil {
		return fmt.Errorf("afxdp: %w", err)
	}
	attach := func(mode link.XDPAttachFlags) error {
		c.link, err = link.AttachXDP(link.XDPOptions{Program: c.prog, Interface: c.ifindex, Flags: mode})
		return err
	}
	switch c.cfg.Attach {
	case AttachNative, AttachAuto:
		if err = attach(link.XDPDriverMode); err == nil {
			c.attached = AttachNative
			break
		}
		if c.cfg.Attach == AttachNative || c.cfg.ZeroCopy || !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("afxdp: attaching native XDP to %s: %w", c.cfg.Interface, explainAttach(err, c.cfg.Interface))
		}
		fallthrough
	case AttachGeneric:
		if err = attach(link.XDPGenericMode); err != nil {
			return fmt.Errorf("afxdp: attaching generic XDP to %s: %w", c.cfg.Interface, explainAttach(err, c.cfg.Interface))
		}
		c.attached = AttachGeneric
	}
	if err := c.xskmap.Put(uint32(c.cfg.QueueID), uint32(c.fd)); err != nil {
		return fmt.Errorf("afxdp: adding socket to xskmap: %w", err)
	}
	return nil
}

// explainAttach says what to change for the usual attach failures.
func explainAttach(err error, ifname string) error {
	switch {
	case errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Errorf("%w: %w (the driver of %s lacks native XDP: set attach = \"generic\" or \"auto\")", ErrNotSupported, err, ifname)
	case errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST):
		return fmt.Errorf("%w (another XDP program is attached to %s: detach it, e.g. ip link set dev %s xdp off)", err, ifname, ifname)
	}
	return explainBPF(err)
}

// AttachMode reports how the XDP program ended up attached: AttachNative
// or AttachGeneric.
func (c *XDPConn) AttachMode() string { return c.attached }

// Config returns the configuration in effect, defaults filled in.
func (c *XDPConn) Config() Config {
	cfg := c.cfg
	cfg.Cores = append([]int(nil), cfg.Cores...)
	return cfg
}

// BatchSize implements Conn.
func (c *XDPConn) BatchSize() int { return xdpBatchPackets }

// MaxPayload implements Conn: FrameBytes minus the 256-byte receive
// headroom and the headers, and at most what the interface MTU carries.
func (c *XDPConn) MaxPayload() int { return c.maxPayload }

// LocalAddr implements Conn.
func (c *XDPConn) LocalAddr() netip.AddrPort { return c.local }

// Stats returns a snapshot of the packet counters.
func (c *XDPConn) Stats() Counters { return c.ctr.snapshot() }

// KernelStats returns the socket's XDP_STATISTICS (drops the kernel saw:
// RX ring full, fill ring empty, invalid descriptors).
func (c *XDPConn) KernelStats() (unix.XDPStatistics, error) {
	var st unix.XDPStatistics
	if c.closed.Load() {
		return st, ErrClosed
	}
	err := getsockopt(c.fd, unix.XDP_STATISTICS, unsafe.Pointer(&st), unsafe.Sizeof(st))
	return st, err
}

// ReadBatch implements Conn. Malformed or foreign frames are counted
// (Stats) and dropped. In busy mode it spins until a datagram arrives; in
// adaptive mode it spins up to SpinMicros, then sleeps in poll(2). With
// Config.Cores set, the first goroutine to call it is pinned to Cores[0].
//
// Datagrams to our port that the XDP program passes to the kernel (those
// arriving on other queues, IPv4 with options, fragments, IPv6 with
// extension headers) land in the kernel socket on our address; ReadBatch
// reads that too, so they are slower but not lost (Stats().RxKernel).
func (c *XDPConn) ReadBatch(pkts []Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.closed.Load() {
		return 0, ErrClosed
	}
	if !c.pinned && len(c.cfg.Cores) > 0 {
		if err := PinToCPU(c.cfg.Cores[0]); err != nil {
			return 0, err
		}
		c.pinned = true
	}
	spin := time.Duration(c.cfg.SpinMicros) * time.Microsecond
	var spinStart time.Time
	for spins := 1; ; spins++ {
		if n := c.receive(pkts); n > 0 {
			return n, nil
		}
		if c.closed.Load() {
			return 0, ErrClosed
		}
		if spins%shadowCheckSpins == 0 {
			if n := c.receiveKernel(pkts); n > 0 {
				return n, nil
			}
		}
		if c.fill.needWakeup() {
			// Zero-copy drivers ask to be kicked to use new fill entries.
			unix.Syscall6(unix.SYS_RECVFROM, uintptr(c.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		}
		// Yield between spins: the goroutine this loop just woke (the
		// consensus loop fed by the last batch) sits in this P's run-next
		// slot and would otherwise wait for the whole spin and poll(2)
		// sleep. Measured in e2e's BenchmarkAFXDPHops: the follower leg
		// fell from ~300 us to ~140 us at p50 on a loaded 2-core VM.
		runtime.Gosched()
		if c.cfg.Poll == PollBusy {
			continue
		}
		if spinStart.IsZero() {
			spinStart = time.Now()
			continue
		}
		if time.Since(spinStart) < spin {
			continue
		}
		if err := c.sleep(unix.POLLIN); err != nil {
			return 0, err
		}
		if n := c.receiveKernel(pkts); n > 0 {
			return n, nil
		}
		spinStart = time.Time{}
	}
}

// receiveKernel reads, without waiting, what the kernel socket holds.
func (c *XDPConn) receiveKernel(pkts []Packet) int {
	n, err := c.shadow.readNonblock(pkts)
	if err != nil {
		return 0
	}
	c.ctr.rxKernel.Add(uint64(n))
	c.ctr.rxPackets.Add(uint64(n))
	for _, p := range pkts[:n] {
		c.ctr.rxBytes.Add(uint64(p.N))
	}
	return n
}

// sleep waits in poll(2) for events on the socket, or a Close, or (when
// receiving) a datagram on the kernel socket.
func (c *XDPConn) sleep(events int16) error {
	fds := []unix.PollFd{{Fd: int32(c.fd), Events: events}, {Fd: int32(c.wakeFD), Events: unix.POLLIN}, {Fd: -1}}
	if events == unix.POLLIN {
		fds[2] = unix.PollFd{Fd: int32(c.shadowFD), Events: unix.POLLIN}
	}
	_, err := unix.Poll(fds, pollTimeoutMillis)
	if err != nil && !errors.Is(err, unix.EINTR) {
		return fmt.Errorf("afxdp: poll: %w", err)
	}
	if c.closed.Load() {
		return ErrClosed
	}
	return nil
}

// receive consumes what the RX ring holds (up to len(pkts)) and returns
// how many datagrams it delivered. Every consumed chunk goes back to the
// fill ring.
func (c *XDPConn) receive(pkts []Packet) int {
	avail := c.rx.available(uint32(min(len(pkts), xdpBatchPackets)))
	if avail == 0 {
		return 0
	}
	now := time.Now()
	fb := uint64(c.cfg.FrameBytes)
	umemLen := uint64(len(c.umem))
	rxHalf := umemLen / 2 // receive chunks live below this offset
	out := 0
	for i := uint32(0); i < avail; i++ {
		d := c.rx.descAt(c.rx.local + i)
		addr, n := d.Addr, uint64(d.Len)
		if base := addr - addr%fb; base < rxHalf && len(c.rxFree) < cap(c.rxFree) {
			c.rxFree = append(c.rxFree, base)
		}
		if addr >= umemLen || n > umemLen-addr || addr%fb+n > fb {
			c.ctr.rxTruncated.Add(1) // a descriptor outside its chunk: never trust it
			continue
		}
		f, v := parseFrame(c.umem[addr:addr+n], c.local, c.cfg.AcceptPartialChecksum)
		switch v {
		case verdictOK:
		case verdictRunt:
			c.ctr.rxRunt.Add(1)
			continue
		case verdictTruncated:
			c.ctr.rxTruncated.Add(1)
			continue
		case verdictBadChecksum:
			c.ctr.rxBadCsum.Add(1)
			continue
		default:
			c.ctr.rxForeign.Add(1)
			continue
		}
		p := &pkts[out]
		if len(f.payload) > len(p.Buf) {
			c.ctr.rxTruncated.Add(1)
			continue
		}
		p.N = copy(p.Buf, f.payload)
		p.Addr = f.src
		c.neigh.learn(f.src.Addr(), f.srcMAC, now)
		c.ctr.rxPackets.Add(1)
		c.ctr.rxBytes.Add(uint64(p.N))
		out++
	}
	c.rx.release(avail)
	c.refill()
	return out
}

// refill moves free receive chunks into the fill ring.
func (c *XDPConn) refill() {
	n := c.fill.free(uint32(len(c.rxFree)))
	if n == 0 {
		return
	}
	for i := uint32(0); i < n; i++ {
		*c.fill.addrAt(c.fill.local + i) = c.rxFree[len(c.rxFree)-1-int(i)]
	}
	c.rxFree = c.rxFree[:len(c.rxFree)-int(n)]
	c.fill.submit(n)
}

// WriteBatch implements Conn. Datagrams to a peer whose MAC is not known
// yet go through the kernel (see neigh_linux.go). It returns at the first
// packet it cannot send, with the count before it.
func (c *XDPConn) WriteBatch(pkts []Packet) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return 0, ErrClosed
	}
	c.reap()
	now := time.Now()
	var queued uint32
	sent := 0
	fb := uint64(c.cfg.FrameBytes)
	for i := range pkts {
		p := &pkts[i]
		if p.N < 0 || p.N > c.maxPayload || p.N > len(p.Buf) {
			return sent + c.flush(&queued), ErrPayloadTooLarge
		}
		dst := netip.AddrPortFrom(p.Addr.Addr().Unmap(), p.Addr.Port())
		if dst.Addr().Is4() != c.local.Addr().Is4() || !dst.IsValid() {
			return sent + c.flush(&queued), fmt.Errorf("afxdp: conn on %v cannot send to %v", c.local, p.Addr)
		}
		mac, ok := c.neigh.lookup(dst.Addr(), now)
		if !ok {
			sent += c.flush(&queued)
			c.one[0] = Packet{Buf: p.Buf, N: p.N, Addr: dst}
			_, err := c.shadow.WriteBatch(c.one[:])
			c.one[0] = Packet{}
			if err != nil {
				return sent, fmt.Errorf("afxdp: sending to unresolved neighbour %v through the kernel: %w", dst, err)
			}
			c.ctr.txPackets.Add(1)
			c.ctr.txKernel.Add(1)
			c.ctr.txBytes.Add(uint64(p.N))
			sent++
			continue
		}
		if err := c.txSlot(&queued, &sent); err != nil {
			return sent, err
		}
		addr := c.txFree[len(c.txFree)-1]
		c.txFree = c.txFree[:len(c.txFree)-1]
		c.ipID++
		n := buildFrame(c.umem[addr:addr+fb], c.srcMAC, mac, c.local, dst, c.ipID, p.Buf[:p.N])
		*c.tx.descAt(c.tx.local + queued) = unix.XDPDesc{Addr: addr, Len: uint32(n)}
		queued++
		c.ctr.txBytes.Add(uint64(p.N))
	}
	sent += c.flush(&queued)
	return sent, nil
}

// txSlot makes sure a free chunk and a TX ring slot exist for one more
// frame, flushing and waiting (bounded by txStallTotal) if not.
func (c *XDPConn) txSlot(queued *uint32, sent *int) error {
	var deadline time.Time
	for {
		if len(c.txFree) > 0 && c.tx.free(*queued+1) == *queued+1 {
			return nil
		}
		c.ctr.txRingFull.Add(1)
		*sent += c.flush(queued)
		c.reap()
		if len(c.txFree) > 0 && c.tx.free(1) == 1 {
			return nil
		}
		if c.closed.Load() {
			return ErrClosed
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(txStallTotal)
		} else if time.Now().After(deadline) {
			return fmt.Errorf("afxdp: transmit stalled for %v on %s (no completions)", txStallTotal, c.cfg.Interface)
		}
		if c.cfg.Poll == PollAdaptive {
			if err := c.sleep(unix.POLLOUT); err != nil {
				return err
			}
		} else {
			runtime.Gosched()
		}
	}
}

// flush publishes the queued TX descriptors and kicks the kernel; it
// returns how many it published and zeroes *queued.
func (c *XDPConn) flush(queued *uint32) int {
	n := *queued
	if n == 0 {
		return 0
	}
	c.tx.submit(n)
	*queued = 0
	c.ctr.txPackets.Add(uint64(n))
	c.kick()
	return int(n)
}

// kick asks the kernel to transmit what the TX ring holds. In copy mode
// the frames are sent inside sendto, a driver budget per call, so it kicks
// until the kernel has consumed the ring (bounded); frames still there go
// with the next kick.
func (c *XDPConn) kick() {
	for tries := 0; tries < txKickTriesMax && c.tx.pending(); tries++ {
		if !c.tx.needWakeup() {
			return // a zero-copy driver is already processing the ring
		}
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(c.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0, unix.EAGAIN, unix.EBUSY:
		case unix.ENOBUFS:
			runtime.Gosched() // the device queue is full: let it drain
		default:
			return // ENETDOWN and the like: frames stay queued
		}
	}
}

// reap moves completed TX chunks back to the free list.
func (c *XDPConn) reap() {
	n := c.comp.available(c.comp.size)
	fb := uint64(c.cfg.FrameBytes)
	for i := uint32(0); i < n; i++ {
		addr := *c.comp.addrAt(c.comp.local + i)
		c.txFree = append(c.txFree, addr-addr%fb)
	}
	if n > 0 {
		c.comp.release(n)
	}
}

// Close implements Conn. It wakes and waits out in-flight ReadBatch and
// WriteBatch calls, then tears down in order: XSKMAP entry, XDP link,
// socket, map and program, memory.
func (c *XDPConn) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		if c.wakeFD >= 0 {
			var one = [8]byte{1}
			unix.Write(c.wakeFD, one[:])
		}
		c.rmu.Lock()
		c.wmu.Lock()
		c.closeErr = c.teardown()
		c.wmu.Unlock()
		c.rmu.Unlock()
	})
	return c.closeErr
}

// teardown releases everything NewXDP acquired, in reverse dependency
// order, and tolerates a partly built Conn.
func (c *XDPConn) teardown() error {
	var errs []error
	if c.xskmap != nil {
		if err := c.xskmap.Delete(uint32(c.cfg.QueueID)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting xskmap entry: %w", err))
		}
	}
	if c.link != nil {
		if err := c.link.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detaching xdp: %w", err))
		}
		c.link = nil
	}
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
	if c.xskmap != nil {
		c.xskmap.Close()
		c.xskmap = nil
	}
	if c.prog != nil {
		c.prog.Close()
		c.prog = nil
	}
	for _, r := range []*ring{c.rx, c.tx, c.fill, c.comp} {
		r.unmap()
	}
	if c.umem != nil {
		unix.Munmap(c.umem)
		c.umem = nil
	}
	if c.shadow != nil {
		c.shadow.Close()
	}
	if c.neigh != nil {
		c.neigh.close()
	}
	if c.wakeFD >= 0 {
		unix.Close(c.wakeFD)
		c.wakeFD = -1
	}
	if len(errs) > 0 {
		return fmt.Errorf("afxdp: closing: %w", errors.Join(errs...))
	}
	return nil
}

func setsockopt(fd, opt int, val unsafe.Pointer, size uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(val), size, 0)
	if e != 0 {
		return e
	}
	return nil
}

func getsockopt(fd, opt int, val unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(val), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}
