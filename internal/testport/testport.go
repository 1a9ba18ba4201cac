// Package testport hands tests loopback ports to listen on.
//
// Free prefers ports below the kernel's ephemeral range: a port taken
// from that range and released may meanwhile become the source port of
// some outgoing connection (any test process's client), and the node
// that was to bind it then fails with "address already in use" (seen in
// CI: kv/replica's side channel, an e2e node's restart). It never hands
// out one port twice in a process.
package testport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
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
)

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
			if given[p] {
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
