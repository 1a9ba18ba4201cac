package raftpath

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// preallocate allocates f's blocks up to bytes (keeping any data), so
// appends below that size need no metadata update at fdatasync. Where the
// filesystem cannot (EOPNOTSUPP) the file simply grows as it is written.
func preallocate(f *os.File, bytes int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, bytes)
	if err == unix.EOPNOTSUPP || err == unix.ENOSYS {
		return nil
	}
	if err != nil {
		return fmt.Errorf("preallocating wal segment: %w", err)
	}
	return nil
}
