//go:build linux

package server

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// peerHungUp reports whether nc's peer has shut down its sending side
// (its FIN has arrived), whether or not bytes it sent before are still
// unread: Linux's POLLRDHUP, asked without waiting. false when it cannot
// tell (not a socket, or the poll failed). A TLS connection is asked
// through the connection under it.
func peerHungUp(nc net.Conn) bool {
	if t, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = t.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	hung := false
	raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 &&
			fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0 {
			hung = true
		}
	})
	return hung
}
