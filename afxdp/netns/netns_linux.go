// Package netns builds throwaway network namespaces joined by a veth pair
// for AF_XDP tests and benchmarks, and runs code inside them. It shells out
// to iproute2's ip(8) for setup and uses setns(2) on a locked thread to
// enter a namespace. Addresses live only inside the namespaces it creates.
package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"synod/afxdp"
)

// Pair is two namespaces, NS[0] and NS[1], joined by a veth pair: If[i]
// lives in NS[i] with addresses Addr4[i]/24 and Addr6[i]/64.
type Pair struct {
	NS    [2]string
	If    [2]string
	Addr4 [2]netip.Addr
	Addr6 [2]netip.Addr
}

// subnetMax bounds the third octet of the test subnet 10.199.<subnet>.0/24.
const subnetMax = 254

// Available reports why namespaces cannot be built here (nil if they can):
// it needs root and ip(8).
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("netns: needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("netns: needs iproute2 ip(8): %w", err)
	}
	return nil
}

// NewPair creates namespaces <name>-a and <name>-b (name should hold the
// pid, e.g. "synod-xdp-1234-0") with a veth pair, addresses 10.199.<subnet>.1
// and .2 /24 and fd00:199:<subnet>::1 and ::2 /64 (no DAD), links and
// loopbacks up, and transmit checksum offload off on both ends (so kernel
// senders put full UDP checksums on the wire; see afxdp.DisableTxChecksum).
// On error it removes what it made.
func NewPair(name string, subnet int) (_ *Pair, err error) {
	if subnet < 1 || subnet > subnetMax {
		return nil, fmt.Errorf("netns: subnet %d out of range 1..%d", subnet, subnetMax)
	}
	p := &Pair{
		NS: [2]string{name + "-a", name + "-b"},
		// Interface names are at most 15 bytes: keep them short and unique
		// per subnet and pid.
		If: [2]string{fmt.Sprintf("sx%da%d", subnet, os.Getpid()%100000), fmt.Sprintf("sx%db%d", subnet, os.Getpid()%100000)},
	}
	for i := range 2 {
		p.Addr4[i] = netip.AddrFrom4([4]byte{10, 199, byte(subnet), byte(i + 1)})
		p.Addr6[i] = netip.MustParseAddr(fmt.Sprintf("fd00:199:%x::%d", subnet, i+1))
	}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	for i := range 2 {
		if err := ip("netns", "add", p.NS[i]); err != nil {
			return nil, err
		}
	}
	if err := ip("link", "add", p.If[0], "netns", p.NS[0], "type", "veth", "peer", "name", p.If[1], "netns", p.NS[1]); err != nil {
		return nil, err
	}
	for i := range 2 {
		ns := p.NS[i]
		steps := [][]string{
			{"-n", ns, "link", "set", "lo", "up"},
			{"-n", ns, "addr", "add", p.Addr4[i].String() + "/24", "dev", p.If[i]},
			{"-n", ns, "addr", "add", p.Addr6[i].String() + "/64", "dev", p.If[i], "nodad"},
			{"-n", ns, "link", "set", p.If[i], "up"},
		}
		for _, s := range steps {
			if err := ip(s...); err != nil {
				return nil, err
			}
		}
		ifname := p.If[i]
		if err := Run(ns, func() error { return afxdp.DisableTxChecksum(ifname) }); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Close deletes both namespaces (which removes the veth pair).
func (p *Pair) Close() error {
	var errs []error
	for _, ns := range p.NS {
		if _, err := os.Stat("/var/run/netns/" + ns); err == nil {
			if err := ip("netns", "del", ns); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Exec runs a command inside namespace ns and returns its combined output.
func Exec(ns string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("netns: %s in %s: %w: %s", strings.Join(args, " "), ns, err, out)
	}
	return string(out), nil
}

// Run calls f on a fresh OS thread that has entered namespace ns. The
// thread is discarded afterwards (the goroutine exits locked), so no other
// goroutine ever runs in ns. Sockets, maps and links f creates stay bound
// to ns and may be used from any thread.
func Run(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread dies with this goroutine.
		fd, err := unix.Open("/var/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("netns: opening %s: %w", ns, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			errc <- fmt.Errorf("netns: entering %s: %w", ns, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netns: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
