package afxdp

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// The kernel's side of a UDPConn: datagrams the kernel dropped because the
// socket's receive buffer was full never reach recvmmsg, so no counter of
// the transport's own sees them (an outside tester's bursts of replayed
// packets lost 230-344 of 520-1200 datagrams this way, visible only in
// /proc/net/udp). A burst from anyone who can reach the port can push
// genuine consensus datagrams out the same way.

// ReceiveBufferBytes is the receive buffer the kernel granted the socket
// (SO_RCVBUF, which Linux reports doubled for its bookkeeping: this is
// the doubled figure, the bytes of datagrams plus overhead it holds).
func (c *UDPConn) ReceiveBufferBytes() (int, error) {
	var n int
	var err error
	if cerr := c.raw.Control(func(fd uintptr) {
		n, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
	}); cerr != nil {
		return 0, cerr
	}
	return n, err
}

// KernelRxDropped is how many datagrams the kernel dropped for this socket
// since it was opened, above all because its receive buffer was full: the
// drops column of the socket's row in /proc/self/net/udp (udp6 for an
// IPv6 socket), found by the socket's inode. It reads the file on each
// call: for metrics, not for the data path.
func (c *UDPConn) KernelRxDropped() (uint64, error) {
	var st unix.Stat_t
	var err error
	if cerr := c.raw.Control(func(fd uintptr) { err = unix.Fstat(int(fd), &st) }); cerr != nil {
		return 0, cerr
	}
	if err != nil {
		return 0, fmt.Errorf("afxdp: fstat of the udp socket: %w", err)
	}
	table := "/proc/self/net/udp"
	if c.v6 {
		table = "/proc/self/net/udp6"
	}
	b, err := os.ReadFile(table)
	if err != nil {
		return 0, fmt.Errorf("afxdp: %w", err)
	}
	return udpTableDrops(b, st.Ino)
}

// udpTableDrops finds the row of the socket whose inode is ino in a
// /proc/net/udp table and returns its drops column (the last). The
// columns: sl local_address rem_address st tx_queue:rx_queue tr:tm->when
// retrnsmt uid timeout inode ref pointer drops.
func udpTableDrops(table []byte, ino uint64) (uint64, error) {
	const inodeCol, dropsCol = 9, 12
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Buffer(make([]byte, 0, 512), udpTableLineBytesMax)
	first := true
	for sc.Scan() {
		if first { // the header line
			first = false
			continue
		}
		f := bytes.Fields(sc.Bytes())
		if len(f) <= dropsCol {
			continue
		}
		if n, err := strconv.ParseUint(string(f[inodeCol]), 10, 64); err != nil || n != ino {
			continue
		}
		d, err := strconv.ParseUint(string(f[dropsCol]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("afxdp: drops column %q of socket inode %d: %w", f[dropsCol], ino, err)
		}
		return d, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("afxdp: reading the udp table: %w", err)
	}
	return 0, fmt.Errorf("afxdp: no row for socket inode %d in the udp table", ino)
}

// udpTableLineBytesMax bounds one line of /proc/net/udp (about 130 bytes
// each today).
const udpTableLineBytesMax = 4096
