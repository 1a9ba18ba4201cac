package afxdp

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// neighMsg builds one RTM_NEWNEIGH message as the kernel sends it.
func neighMsg(seq uint32, ifindex int32, state uint16, dst netip.Addr, mac []byte) []byte {
	attr := func(typ uint16, val []byte) []byte {
		b := make([]byte, nlAlign(4+len(val)))
		binary.NativeEndian.PutUint16(b[0:2], uint16(4+len(val)))
		binary.NativeEndian.PutUint16(b[2:4], typ)
		copy(b[4:], val)
		return b
	}
	body := make([]byte, nlAlign(unix.SizeofNdMsg))
	nd := (*unix.NdMsg)(unsafe.Pointer(&body[0]))
	*nd = unix.NdMsg{Family: unix.AF_INET, Ifindex: ifindex, State: state}
	body = append(body, attr(unix.NDA_DST, dst.AsSlice())...)
	body = append(body, attr(unix.NDA_LLADDR, mac)...)
	h := make([]byte, unix.SizeofNlMsghdr)
	hdr := (*unix.NlMsghdr)(unsafe.Pointer(&h[0]))
	*hdr = unix.NlMsghdr{Len: uint32(len(h) + len(body)), Type: unix.RTM_NEWNEIGH, Seq: seq}
	return append(h, body...)
}

func doneMsg(seq uint32) []byte {
	h := make([]byte, unix.SizeofNlMsghdr+4)
	hdr := (*unix.NlMsghdr)(unsafe.Pointer(&h[0]))
	*hdr = unix.NlMsghdr{Len: uint32(len(h)), Type: unix.NLMSG_DONE, Seq: seq}
	return h
}

func TestParseNeighDump(t *testing.T) {
	ip := netip.MustParseAddr("10.199.1.2")
	mac := []byte{2, 0, 0, 0, 0, 0xb}
	dump := append(neighMsg(7, 3, unix.NUD_FAILED, ip, []byte{9, 9, 9, 9, 9, 9}), // unusable state
		neighMsg(7, 4, unix.NUD_REACHABLE, ip, []byte{8, 8, 8, 8, 8, 8})...) // other interface
	dump = append(dump, neighMsg(7, 3, unix.NUD_STALE, ip, mac)...)
	done, got, hit := parseNeighDump(dump, 7, 3, ip)
	if done || !hit || string(got[:]) != string(mac) {
		t.Fatalf("done=%v hit=%v mac=%x", done, hit, got)
	}
	if done, _, hit := parseNeighDump(append(neighMsg(6, 3, unix.NUD_STALE, ip, mac), doneMsg(7)...), 7, 3, ip); !done || hit {
		t.Fatalf("stale sequence: done=%v hit=%v", done, hit)
	}
}

// FuzzParseNeighDump: whatever a netlink read holds, the parser must not
// panic.
func FuzzParseNeighDump(f *testing.F) {
	ip := netip.MustParseAddr("10.199.1.2")
	f.Add(append(neighMsg(1, 3, unix.NUD_REACHABLE, ip, []byte{2, 0, 0, 0, 0, 0xb}), doneMsg(1)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseNeighDump(b, 1, 3, ip)
	})
}
