package afxdp

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Neighbour resolution. An AF_XDP socket writes whole Ethernet frames, so
// we need the next hop's MAC address. We do not run ARP or ND ourselves;
// the kernel does:
//
//  1. every datagram we receive teaches us its sender's MAC (the frame's
//     source address is exactly the next hop back);
//  2. otherwise we read the kernel's neighbour table with netlink
//     RTM_GETNEIGH (dump, filtered by interface);
//  3. a datagram to a peer still unknown is sent through a kernel UDP
//     socket bound to our own address and port (the "shadow" socket), so it
//     is not lost and the kernel resolves the neighbour as a side effect;
//     the next lookup finds the entry.
//
// Peers must be on-link (same L2 segment), or reached through a router
// whose MAC the kernel's neighbour table holds for the peer's address;
// otherwise every datagram keeps going through the kernel socket, which
// is correct but slow.
const (
	// neighCacheEntriesMax bounds the MAC cache; it is cleared when full.
	neighCacheEntriesMax = 4096
	// neighTTL is how long a cached MAC is used before it is looked up
	// again (a learned one is refreshed by every received datagram).
	neighTTL = 10 * time.Second
	// neighMissRetry is the least time between two netlink lookups for
	// one unresolved address.
	neighMissRetry = 5 * time.Millisecond
	// netlinkReplyBytesMax is the receive buffer for one netlink read.
	netlinkReplyBytesMax = 64 << 10
)

type neighEntry struct {
	mac     [6]byte
	ok      bool // false: a negative entry (lookup failed at 'at')
	expires time.Time
}

// neighCache maps next-hop IP addresses to MACs. ReadBatch (learning) and
// WriteBatch (lookups) use it concurrently.
type neighCache struct {
	mu      sync.Mutex
	entries map[netip.Addr]neighEntry
	nl      int // netlink route socket, opened in the interface's netns
	ifindex int
	buf     []byte
	seq     uint32
}

func newNeighCache(ifindex int) (*neighCache, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding netlink socket: %w", err)
	}
	return &neighCache{
		entries: make(map[netip.Addr]neighEntry),
		nl:      fd,
		ifindex: ifindex,
		buf:     make([]byte, netlinkReplyBytesMax),
	}, nil
}

func (c *neighCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nl >= 0 {
		unix.Close(c.nl)
		c.nl = -1
	}
}

// learn records that ip sent us a frame from mac.
func (c *neighCache) learn(ip netip.Addr, mac [6]byte, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[ip]; ok && e.ok && e.mac == mac && e.expires.Sub(now) > neighTTL/2 {
		return // fresh enough: skip the map write
	}
	c.putLocked(ip, neighEntry{mac: mac, ok: true, expires: now.Add(neighTTL)})
}

func (c *neighCache) putLocked(ip netip.Addr, e neighEntry) {
	if len(c.entries) >= neighCacheEntriesMax {
		clear(c.entries)
	}
	c.entries[ip] = e
}

// lookup returns ip's MAC, asking the kernel when the cache has no fresh
// entry (at most once per neighMissRetry for an unresolved address).
func (c *neighCache) lookup(ip netip.Addr, now time.Time) ([6]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[ip]; ok && now.Before(e.expires) {
		return e.mac, e.ok
	}
	mac, ok := c.queryLocked(ip)
	if ok {
		c.putLocked(ip, neighEntry{mac: mac, ok: true, expires: now.Add(neighTTL)})
	} else {
		c.putLocked(ip, neighEntry{expires: now.Add(neighMissRetry)})
	}
	return mac, ok
}

// usableNUD are the neighbour states whose link-layer address is valid.
const usableNUD = unix.NUD_REACHABLE | unix.NUD_STALE | unix.NUD_DELAY | unix.NUD_PROBE | unix.NUD_PERMANENT | unix.NUD_NOARP

// queryLocked dumps the kernel neighbour table for our interface and
// family and returns ip's link-layer address if it is usable.
func (c *neighCache) queryLocked(ip netip.Addr) ([6]byte, bool) {
	var none [6]byte
	if c.nl < 0 {
		return none, false
	}
	family := uint8(unix.AF_INET)
	if ip.Is6() {
		family = unix.AF_INET6
	}
	c.seq++
	var req [unix.SizeofNlMsghdr + unix.SizeofNdMsg]byte
	hdr := (*unix.NlMsghdr)(unsafe.Pointer(&req[0]))
	*hdr = unix.NlMsghdr{
		Len:   uint32(len(req)),
		Type:  unix.RTM_GETNEIGH,
		Flags: unix.NLM_F_REQUEST | unix.NLM_F_DUMP,
		Seq:   c.seq,
	}
	nd := (*unix.NdMsg)(unsafe.Pointer(&req[unix.SizeofNlMsghdr]))
	*nd = unix.NdMsg{Family: family, Ifindex: int32(c.ifindex)}
	if err := unix.Sendto(c.nl, req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return none, false
	}
	var found [6]byte
	var ok bool
	for {
		n, _, err := unix.Recvfrom(c.nl, c.buf, 0)
		if err != nil {
			return none, false
		}
		done, m, hit := parseNeighDump(c.buf[:n], c.seq, c.ifindex, ip)
		if hit {
			found, ok = m, true
		}
		if done {
			return found, ok
		}
	}
}

// parseNeighDump scans one netlink read of an RTM_GETNEIGH dump for ip on
// ifindex. done reports the end of the dump (or an error message).
func parseNeighDump(b []byte, seq uint32, ifindex int, ip netip.Addr) (done bool, mac [6]byte, hit bool) {
	for len(b) >= unix.SizeofNlMsghdr {
		h := (*unix.NlMsghdr)(unsafe.Pointer(&b[0]))
		l := int(h.Len)
		if l < unix.SizeofNlMsghdr || l > len(b) {
			return true, mac, hit
		}
		msg := b[unix.SizeofNlMsghdr:l]
		b = b[min(nlAlign(l), len(b)):]
		if h.Seq != seq {
			continue
		}
		switch h.Type {
		case unix.NLMSG_DONE, unix.NLMSG_ERROR:
			return true, mac, hit
		case unix.RTM_NEWNEIGH:
		default:
			continue
		}
		if len(msg) < unix.SizeofNdMsg {
			continue
		}
		nd := (*unix.NdMsg)(unsafe.Pointer(&msg[0]))
		if int(nd.Ifindex) != ifindex || nd.State&usableNUD == 0 {
			continue
		}
		var dst netip.Addr
		var ll []byte
		attrs := msg[nlAlign(unix.SizeofNdMsg):]
		for len(attrs) >= 4 {
			alen := int(binary.NativeEndian.Uint16(attrs[0:2]))
			atype := binary.NativeEndian.Uint16(attrs[2:4])
			if alen < 4 || alen > len(attrs) {
				break
			}
			val := attrs[4:alen]
			switch atype {
			case unix.NDA_DST:
				dst, _ = netip.AddrFromSlice(val)
			case unix.NDA_LLADDR:
				ll = val
			}
			attrs = attrs[min(nlAlign(alen), len(attrs)):]
		}
		if dst.Unmap() == ip && len(ll) == 6 {
			copy(mac[:], ll)
			hit = true
		}
	}
	return false, mac, hit
}

func nlAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }
