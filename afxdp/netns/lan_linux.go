package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"

	"synod/afxdp"
)

// nodesMax bounds the nodes of a LAN.
const nodesMax = 16

// LAN is n node namespaces on one Ethernet segment: each node namespace
// NS[i] has interface If[i] ("synod0") with Addr4[i] = 10.199.<subnet>.<i+1>/24
// and Addr6[i] = fd00:199:<subnet>::<i+1>/64, joined by a veth pair to a
// Linux bridge in namespace Hub.
type LAN struct {
	Hub   string
	NS    []string
	If    []string
	Addr4 []netip.Addr
	Addr6 []netip.Addr
}

// lanIfName is every node's interface name (names are per namespace).
const lanIfName = "synod0"

// NewLAN creates namespaces <name>-hub and <name>-0 .. <name>-(n-1) as
// described on LAN, with transmit checksum offload off on the node
// interfaces. On error it removes what it made.
func NewLAN(name string, subnet, n int) (_ *LAN, err error) {
	if subnet < 1 || subnet > subnetMax {
		return nil, fmt.Errorf("netns: subnet %d out of range 1..%d", subnet, subnetMax)
	}
	if n < 1 || n > nodesMax {
		return nil, fmt.Errorf("netns: %d nodes, want 1..%d", n, nodesMax)
	}
	l := &LAN{Hub: name + "-hub"}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if err := ip("netns", "add", l.Hub); err != nil {
		return nil, err
	}
	if err := ipAll(
		[]string{"-n", l.Hub, "link", "add", "br0", "type", "bridge"},
		[]string{"-n", l.Hub, "link", "set", "br0", "up"},
	); err != nil {
		return nil, err
	}
	for i := range n {
		ns := fmt.Sprintf("%s-%d", name, i)
		if err := ip("netns", "add", ns); err != nil {
			return nil, err
		}
		l.NS = append(l.NS, ns)
		l.If = append(l.If, lanIfName)
		a4 := netip.AddrFrom4([4]byte{10, 199, byte(subnet), byte(i + 1)})
		a6 := netip.MustParseAddr(fmt.Sprintf("fd00:199:%x::%x", subnet, i+1))
		l.Addr4 = append(l.Addr4, a4)
		l.Addr6 = append(l.Addr6, a6)
		hubIf := fmt.Sprintf("hub%d", i)
		if err := ipAll(
			[]string{"link", "add", lanIfName, "netns", ns, "type", "veth", "peer", "name", hubIf, "netns", l.Hub},
			[]string{"-n", l.Hub, "link", "set", hubIf, "master", "br0"},
			[]string{"-n", l.Hub, "link", "set", hubIf, "up"},
			[]string{"-n", ns, "link", "set", "lo", "up"},
			[]string{"-n", ns, "addr", "add", a4.String() + "/24", "dev", lanIfName},
			[]string{"-n", ns, "addr", "add", a6.String() + "/64", "dev", lanIfName, "nodad"},
			[]string{"-n", ns, "link", "set", lanIfName, "up"},
		); err != nil {
			return nil, err
		}
		if err := Run(ns, func() error { return afxdp.DisableTxChecksum(lanIfName) }); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Close deletes every namespace of the LAN.
func (l *LAN) Close() error {
	var errs []error
	for _, ns := range append([]string{l.Hub}, l.NS...) {
		if err := ip("netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func ipAll(cmds ...[]string) error {
	for _, c := range cmds {
		if err := ip(c...); err != nil {
			return err
		}
	}
	return nil
}

// hostPeerIfName is the hub-side end of the root namespace's veth (names
// are per namespace, so one per LAN suffices).
const hostPeerIfName = "host0"

// AddHostLink joins the root namespace to the LAN's bridge with a veth
// pair: the root end is named name (at most 15 bytes, unique in the root
// namespace) and gets address host (e.g. 10.199.<subnet>.254/24); the hub
// end "host0" is enslaved to the bridge. Both ends are up. The returned
// remove deletes the root end if it still exists (deleting the hub
// namespace, as Close does, usually takes the pair with it). On error it
// removes what it made.
func (l *LAN) AddHostLink(name string, host netip.Prefix) (remove func() error, err error) {
	remove = func() error {
		if exec.Command("ip", "link", "show", name).Run() != nil {
			return nil
		}
		return ip("link", "del", name)
	}
	if err := ipAll(
		[]string{"link", "add", name, "type", "veth", "peer", "name", hostPeerIfName, "netns", l.Hub},
		[]string{"-n", l.Hub, "link", "set", hostPeerIfName, "master", "br0"},
		[]string{"-n", l.Hub, "link", "set", hostPeerIfName, "up"},
		[]string{"addr", "add", host.String(), "dev", name},
		[]string{"link", "set", name, "up"},
	); err != nil {
		remove()
		return nil, err
	}
	return remove, nil
}
