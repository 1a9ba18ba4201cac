//go:build !linux

package pmem

import (
	"fmt"
	"os"
	"time"
)

type region struct {
	f    *os.File
	mem  []byte
	mode Mode
}

func mapRegion(f *os.File, size int64, mode Mode) (*region, error) {
	return nil, fmt.Errorf("pmem: mapping a region: %w", ErrNotSupported)
}

func (r *region) persist(off, n int64) error { return ErrNotSupported }
func (r *region) close() error               { return r.f.Close() }

// DetectMode returns an error wrapping ErrNotSupported off Linux.
func DetectMode(path string) (Mode, error) {
	return "", fmt.Errorf("pmem: detecting mode: %w", ErrNotSupported)
}

func syncDir(dir string) error { return nil }

func lockFile(f *os.File, wait time.Duration) error { return nil }
