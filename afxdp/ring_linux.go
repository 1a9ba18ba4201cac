package afxdp

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is one of the four single-producer/single-consumer rings shared
// with the kernel. The producer and consumer indices live in the mmap'd
// region and are read and written only with sync/atomic (sequentially
// consistent, so at least acquire/release): a load of the other side's
// index happens before we touch the descriptors it publishes, and our
// descriptor writes happen before the store that publishes them.
//
// Indices are free-running uint32s; slot = index & mask.
type ring struct {
	mem      []byte
	producer *uint32
	consumer *uint32
	flags    *uint32
	descs    unsafe.Pointer
	mask     uint32
	size     uint32

	// Our side's private copy of our index, and a cached view of the
	// other side's (refreshed only when the cache says we are out of
	// room or entries).
	local  uint32
	cached uint32
}

// mapRing mmaps a ring of n entries of descBytes each.
func mapRing(fd int, off unix.XDPRingOffset, pgoff int64, n uint32, descBytes uintptr) (*ring, error) {
	length := int(off.Desc) + int(n)*int(descBytes)
	mem, err := unix.Mmap(fd, pgoff, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mapping ring at page offset %#x: %w", pgoff, err)
	}
	base := unsafe.Pointer(&mem[0])
	return &ring{
		mem:      mem,
		producer: (*uint32)(unsafe.Add(base, off.Producer)),
		consumer: (*uint32)(unsafe.Add(base, off.Consumer)),
		flags:    (*uint32)(unsafe.Add(base, off.Flags)),
		descs:    unsafe.Add(base, off.Desc),
		mask:     n - 1,
		size:     n,
	}, nil
}

func (r *ring) unmap() {
	if r != nil && r.mem != nil {
		unix.Munmap(r.mem)
		r.mem = nil
	}
}

// needWakeup reports whether the kernel asked to be kicked for this ring.
func (r *ring) needWakeup() bool {
	return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0
}

// Producer side (fill, TX): local is our producer index, cached the
// kernel's consumer index.

// free returns how many slots (up to want) may be produced now.
func (r *ring) free(want uint32) uint32 {
	n := r.size - (r.local - r.cached)
	if n < want {
		r.cached = atomic.LoadUint32(r.consumer)
		n = r.size - (r.local - r.cached)
	}
	return min(n, want)
}

// submit publishes n produced slots to the kernel.
func (r *ring) submit(n uint32) {
	r.local += n
	atomic.StoreUint32(r.producer, r.local)
}

// pending reports whether the kernel has not yet consumed everything we
// produced.
func (r *ring) pending() bool {
	return atomic.LoadUint32(r.consumer) != r.local
}

// Consumer side (RX, completion): local is our consumer index, cached the
// kernel's producer index.

// available returns how many entries (up to want) may be consumed now.
func (r *ring) available(want uint32) uint32 {
	n := r.cached - r.local
	if n == 0 {
		r.cached = atomic.LoadUint32(r.producer)
		n = r.cached - r.local
	}
	return min(n, want)
}

// release hands n consumed entries back to the kernel.
func (r *ring) release(n uint32) {
	r.local += n
	atomic.StoreUint32(r.consumer, r.local)
}

// addrAt is the i'th uint64 slot of a fill or completion ring.
func (r *ring) addrAt(idx uint32) *uint64 {
	return (*uint64)(unsafe.Add(r.descs, uintptr(idx&r.mask)*8))
}

// descAt is the i'th xdp_desc slot of an RX or TX ring.
func (r *ring) descAt(idx uint32) *unix.XDPDesc {
	return (*unix.XDPDesc)(unsafe.Add(r.descs, uintptr(idx&r.mask)*unsafe.Sizeof(unix.XDPDesc{})))
}
