package main

import (
	"fmt"
	"os"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// prepareDataDir creates data_dir and checks the disk reserve against its
// filesystem (checkReserve), logging the warning if there is one.
func (c *Config) prepareDataDir(log zerolog.Logger) error {
	if err := os.MkdirAll(c.DataDir, 0o750); err != nil {
		return fmt.Errorf("creating data_dir: %w", err)
	}
	warning, err := checkReserve(c.DataDir, c.Limits.diskFreeMinBytes(), fsSpace)
	if warning != "" {
		log.Warn().Msg(warning)
	}
	return err
}

// fsSpace is what statfs says of path's filesystem: its size and the
// bytes an unprivileged writer may still use (as kv/space reads them).
func fsSpace(path string) (size, free int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return int64(st.Blocks) * int64(st.Bsize), int64(st.Bavail) * int64(st.Bsize), nil
}

// checkReserve compares the disk reserve ([limits] disk_free_min_bytes,
// 0: off) with data_dir's filesystem at startup. A reserve at or above the
// filesystem's size can never be met: every write that grows the store
// would be refused NO_SPACE from the first, which an operator would
// otherwise learn from clients (an outside check: kvnode started silently
// so). That is an error naming the key. A filesystem that has less free
// than the reserve now is a warning (returned, for the log): writes that
// grow the store are refused until room is made, which is the reserve
// doing its job. space is fsSpace (tests plant their own).
func checkReserve(dataDir string, reserve int64, space func(string) (size, free int64, err error)) (warning string, err error) {
	if reserve <= 0 {
		return "", nil
	}
	size, free, err := space(dataDir)
	if err != nil {
		return "", fmt.Errorf("limits.disk_free_min_bytes: reading data_dir's filesystem: %w", err)
	}
	if reserve >= size {
		return "", fmt.Errorf("limits.disk_free_min_bytes: %d is not below the size of data_dir's filesystem (%d bytes at %s): every write would be refused NO_SPACE; set it lower (the default is sized for disks of tens of GiB), or 0 to turn the check off",
			reserve, size, dataDir)
	}
	if free < reserve {
		return fmt.Sprintf("data_dir's filesystem has %d bytes free, below the disk reserve of %d (disk_free_min_bytes): writes that grow the store are refused NO_SPACE until room is made (deletes are served)", free, reserve), nil
	}
	return "", nil
}
