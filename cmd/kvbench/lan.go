package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"

	"synod/afxdp"
	"synod/afxdp/netns"
)

// Paths whose nodes run in network namespaces (paxos-udp-netns,
// paxos-afxdp) get a LAN of their own (afxdp/netns.NewLAN: namespaces
// kvbench-<pid>-<k>-0..n-1, each with interface "synod0" at
// 10.199.<subnet>.1..n/24, bridged in kvbench-<pid>-<k>-hub), and every
// kvnode starts with `ip netns exec <ns> kvnode`. kvbench itself stays in
// the root namespace: one more veth pair from the root into the hub's
// bridge, with 10.199.<subnet>.254/24 on the root end, carries the
// clients' TCP (and ARP); consensus datagrams stay between the node
// namespaces, where the AF_XDP sockets are. The same approach as the
// end-to-end tests (e2e/afxdp_cluster_test.go).

// Limits of the namespace clusters.
const (
	// lanSubnetBase..+lanSubnetSpan-1 are the third octets used; the
	// afxdp package's own tests stay below 100.
	lanSubnetBase = 100
	lanSubnetSpan = 150
	// lanHostOctet is the root namespace's address on the LAN.
	lanHostOctet = 254
	// lanFrameCount is each AF_XDP node's UMEM size (2048-byte frames:
	// 2 MiB locked per node).
	lanFrameCount = 1024
	// lanIfName is every node's interface inside its namespace.
	lanIfName = "synod0"
)

// lanSeq numbers this process's LANs, so that two at once (never, today:
// paths run one after another) would not share a subnet.
var lanSeq atomic.Int64

// lan is one namespace cluster's network: the node namespaces and the
// root end of the link to them.
type lan struct {
	net    *netns.LAN
	hostIf string // root-namespace end of the veth into the hub bridge
	// removeHost deletes hostIf (nil until netns.LAN.AddHostLink made it).
	removeHost func() error
	subnet     int
}

// netnsUnavailable says why namespaces cannot be built here ("" if they
// can).
func netnsUnavailable() string {
	if err := netns.Available(); err != nil {
		return fmt.Sprintf("nodes in network namespaces: %v (run kvbench as root with iproute2)", err)
	}
	return ""
}

// newLAN builds n node namespaces and the root's link to them, and for
// transport kind "afxdp" checks that an AF_XDP socket opens inside one of
// them (port: the consensus port it will use). On error it removes what it
// made.
func newLAN(n int, kind string, port uint16) (_ *lan, err error) {
	if why := netnsUnavailable(); why != "" {
		return nil, errors.New(why)
	}
	k := lanSeq.Add(1) - 1
	subnet, err := freeSubnet(int(k))
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("kvbench-%d-%d", os.Getpid(), k)
	nl, err := netns.NewLAN(name, subnet, n)
	if err != nil {
		return nil, fmt.Errorf("building namespaces: %w", err)
	}
	l := &lan{net: nl, subnet: subnet, hostIf: fmt.Sprintf("kb%d-%d", os.Getpid()%1_000_000, subnet)}
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	host := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 199, byte(subnet), lanHostOctet}), 24)
	if l.removeHost, err = nl.AddHostLink(l.hostIf, host); err != nil {
		return nil, err
	}
	if kind == afxdp.TransportAFXDP {
		if err := netns.Run(nl.NS[0], func() error {
			x, err := afxdp.NewXDP(afxdp.Config{Interface: lanIfName, Port: port, FrameCount: lanFrameCount})
			if err != nil {
				return err
			}
			return x.Close()
		}); err != nil {
			return nil, fmt.Errorf("AF_XDP unavailable in namespace %s: %w", nl.NS[0], err)
		}
	}
	return l, nil
}

// freeSubnet picks a third octet derived from the pid (and k) whose /24
// no root-namespace interface holds yet (another kvbench or an e2e test
// running at the same time).
func freeSubnet(k int) (int, error) {
	start := (os.Getpid()*3 + k) % lanSubnetSpan
	for i := range lanSubnetSpan {
		s := lanSubnetBase + (start+i)%lanSubnetSpan
		out, err := exec.Command("ip", "-4", "-o", "addr", "show", "to", fmt.Sprintf("10.199.%d.0/24", s)).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("ip addr show: %w: %s", err, strings.TrimSpace(string(out)))
		}
		if strings.TrimSpace(string(out)) == "" {
			return s, nil
		}
	}
	return 0, fmt.Errorf("no free subnet in 10.199.%d-%d.0/24", lanSubnetBase, lanSubnetBase+lanSubnetSpan-1)
}

// addrs lists the nodes' IPv4 addresses, node 1 first.
func (l *lan) addrs() []string {
	var out []string
	for _, a := range l.net.Addr4 {
		out = append(out, a.String())
	}
	return out
}

// command runs kvnode inside node i's namespace (1-based). `ip netns exec`
// execs kvnode in place, so the process's pid is kvnode's: SIGTERM, the
// CPU figures and the hog's pinning reach it.
func (l *lan) command(i int, kvnode string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", l.net.NS[i-1], kvnode}, args...)...)
}

// close removes the namespaces and the root's veth (usually gone already
// with the hub namespace; made sure of here).
func (l *lan) close() error {
	var errs []error
	if err := l.net.Close(); err != nil {
		errs = append(errs, err)
	}
	if l.removeHost != nil {
		if err := l.removeHost(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// kernelUDP sums the kernel UDP stack's datagrams (Udp InDatagrams +
// OutDatagrams of /proc/net/snmp) over the node namespaces. An AF_XDP
// node's consensus traffic bypasses that stack; a udp node's does not, so
// the figure shows which transport carried consensus.
func (l *lan) kernelUDP() (int64, error) {
	var sum int64
	for _, ns := range l.net.NS {
		n, err := netns.KernelUDPDatagrams(ns)
		if err != nil {
			return 0, err
		}
		sum += int64(n)
	}
	return sum, nil
}
