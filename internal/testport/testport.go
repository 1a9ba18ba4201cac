// Package testport hands tests loopback ports to listen on.
//
// Free prefers ports below the kernel's ephemeral range: a port taken
// from that range and released may meanwhile become the source port of
// some outgoing connection (any test process's client), and the node
// that was to bind it then fails with "address already in use" (seen in
// CI: kv/replica's side channel, an e2e node's restart). It never hands
// out one port twice in a process, nor one that another live process
// took through it: the test binaries of two packages run side by side
// (go test -p 2), and a port one had handed to a node that was down for a
// restart was once picked and bound by the other meanwhile (CI: an e2e
// node's side channel, "bind: address already in use"). A process claims
// each port it hands out with a one-byte fcntl lock at that offset of a
// shared file, which the kernel drops when the process ends.
package testport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// pickMin is the lowest port Free picks; attemptsMax bounds its tries.
const (
	pickMin     = 20000
	attemptsMax = 200
)

var (
	mu    sync.Mutex
	given = map[int]bool{}
	// claims is the shared file whose byte p this process locks for
	// port p (nil until the first claim; claimsOff when it cannot be
	// opened, and then ports go unclaimed, as before).
	claims    *os.File
	claimsOff bool
)

// claimsFile is where the claims of every test process meet.
var claimsFile = filepath.Join(os.TempDir(), "synod-testport.lock")

// claim takes port p for this process unless another live one holds it
// (mu held).
func claim(p int) bool {
	if claimsOff {
		return true
	}
	if claims == nil {
		f, err := os.OpenFile(claimsFile, os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			claimsOff = true
			return true
		}
		claims = f
	}
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: int64(p), Len: 1}
	return syscall.FcntlFlock(claims.Fd(), syscall.F_SETLK, &lk) == nil
}

// Free returns a loopback port free for both TCP and UDP now (a consensus
// address uses both), below the ephemeral range when the kernel says
// where it starts.
func Free(t testing.TB) int {
	t.Helper()
	lo := ephemeralLow()
	mu.Lock()
	defer mu.Unlock()
	for i := 0; i < attemptsMax; i++ {
		p := 0
		if lo > pickMin+1000 {
			p = pickMin + rand.IntN(lo-pickMin)
		}
		if given[p] {
			// Free now, but already handed to a node of this process
			// that may not have bound it yet.
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		p = ln.Addr().(*net.TCPAddr).Port
		uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p})
		ln.Close()
		if err == nil {
			uc.Close()
			if given[p] || !claim(p) {
				continue
			}
			given[p] = true
			return p
		}
	}
	t.Fatal("testport: no free port")
	return 0
}

// ephemeralLow is the first port of the kernel's ephemeral range (0 if
// unknown).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		return 0
	}
	return lo
}
