package afxdp

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DisableTxChecksum turns transmit checksum offload off on the named
// interface in the calling thread's network namespace (ethtool -K IF tx
// off). A veth with the offload on hands its peer UDP datagrams whose
// checksum field holds only the pseudo-header sum; an AF_XDP reader
// verifying checksums drops those. Needs CAP_NET_ADMIN.
func DisableTxChecksum(ifname string) error { return SetTxChecksum(ifname, false) }

// SetTxChecksum turns transmit checksum offload on or off (ethtool -K IF
// tx on|off) in the calling thread's network namespace.
func SetTxChecksum(ifname string, on bool) error {
	if len(ifname) == 0 || len(ifname) >= unix.IFNAMSIZ {
		return fmt.Errorf("afxdp: setting tx checksum offload: bad interface name %q", ifname)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("afxdp: setting tx checksum offload: %w", err)
	}
	defer unix.Close(fd)
	var data uint32
	if on {
		data = 1
	}
	// On the heap, so its address stays valid while only a uintptr names it.
	value := &struct{ cmd, data uint32 }{cmd: unix.ETHTOOL_STXCSUM, data: data}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [24]byte
	}
	copy(ifr.name[:], ifname)
	ifr.data = uintptr(unsafe.Pointer(value))
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(value)
	if e != 0 {
		return fmt.Errorf("afxdp: setting tx checksum offload on %s to %v: %w", ifname, on, e)
	}
	return nil
}
