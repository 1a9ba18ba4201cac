package pmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// region is a file mapped MAP_SHARED and the way its stores are persisted.
type region struct {
	f    *os.File
	mem  []byte
	mode Mode
	page int64
}

// mapRegion maps all of f (size bytes) for mode.
func mapRegion(f *os.File, size int64, mode Mode) (*region, error) {
	flags := unix.MAP_SHARED
	if mode == ModeDAX {
		if FlushInstruction() == "none" {
			return nil, fmt.Errorf("pmem: dax mode needs CLWB, CLFLUSHOPT or CLFLUSH: %w", ErrNotSupported)
		}
		flags = unix.MAP_SHARED_VALIDATE | unix.MAP_SYNC
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		if mode == ModeDAX && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
			return nil, fmt.Errorf("pmem: mapping %s with MAP_SYNC: %w: %s is not on a DAX filesystem; "+
				"use mode %q, or put the log on a filesystem mounted with -o dax (ext4/xfs on a pmem device)",
				f.Name(), ErrDAXUnavailable, f.Name(), ModeMsync)
		}
		return nil, fmt.Errorf("pmem: mapping %s: %w", f.Name(), err)
	}
	return &region{f: f, mem: mem, mode: mode, page: int64(os.Getpagesize())}, nil
}

// persist makes the stores to mem[off:off+n] durable for the region's
// mode.
func (r *region) persist(off, n int64) error {
	if persistHook != nil {
		persistHook(r, off, n)
	}
	switch r.mode {
	case ModeDAX:
		if n > 0 {
			flushLines(uintptr(unsafe.Pointer(&r.mem[off])), uintptr(n))
		} else {
			storeFence()
		}
	case ModeMsync:
		if n <= 0 {
			return nil
		}
		start := off &^ (r.page - 1)
		end := min((off+n+r.page-1)&^(r.page-1), int64(len(r.mem)))
		if err := unix.Msync(r.mem[start:end], unix.MS_SYNC); err != nil {
			return fmt.Errorf("pmem: msync: %w", err)
		}
	case ModeShm:
		storeFence()
	}
	return nil
}

func (r *region) close() error {
	err := unix.Munmap(r.mem)
	r.mem = nil
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// DetectMode picks the persist mode for a log at path: shm when the
// directory is on tmpfs, dax when a probe file there maps with MAP_SYNC,
// msync otherwise.
func DetectMode(path string) (Mode, error) {
	dir := filepath.Dir(path)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", fmt.Errorf("pmem: detecting mode: statfs %s: %w", dir, err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		return ModeShm, nil
	}
	if FlushInstruction() == "none" {
		return ModeMsync, nil
	}
	f, err := os.CreateTemp(dir, ".pmem-probe-*")
	if err != nil {
		return "", fmt.Errorf("pmem: detecting mode: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := f.Truncate(int64(os.Getpagesize())); err != nil {
		return "", fmt.Errorf("pmem: detecting mode: %w", err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_SHARED_VALIDATE|unix.MAP_SYNC)
	if err != nil {
		return ModeMsync, nil
	}
	_ = unix.Munmap(mem)
	return ModeDAX, nil
}

// syncDir makes a file creation in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// lockFile takes an exclusive advisory lock on the region file, so that a
// second Log on the same file (another process, or this one) is refused
// instead of corrupting it. The kernel drops the lock when the holder
// dies. A lock held by another is tried again every lockRetryInterval
// until wait has passed (Options.LockWait).
func lockFile(f *os.File, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("pmem: locking %s: %w", f.Name(), err)
		}
		if !time.Now().Before(deadline) {
			if wait > 0 {
				return fmt.Errorf("%w: %s (still, after waiting %v)", ErrLocked, f.Name(), wait)
			}
			return fmt.Errorf("%w: %s", ErrLocked, f.Name())
		}
		time.Sleep(min(lockRetryInterval, time.Until(deadline)))
	}
}

// lockRetryInterval is how often lockFile tries a held lock again.
const lockRetryInterval = 20 * time.Millisecond
