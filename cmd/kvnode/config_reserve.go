package main

import (
	"fmt"
	"os"

	"github.com/rs/zerolog"

	"synod/kv/space"
)

// prepareDataDir creates data_dir and checks the disk reserve against its
// filesystem (checkReserve), logging the warning if there is one.
func (c *Config) prepareDataDir(log zerolog.Logger) error {
	if err := os.MkdirAll(c.DataDir, 0o750); err != nil {
		return fmt.Errorf("creating data_dir: %w", err)
	}
	warning, err := checkReserve(c.DataDir, c.Limits.diskFreeMinBytes(), space.FilesystemBytes)
	if warning != "" {
		log.Warn().Msg(warning)
	}
	return err
}

// checkReserve compares the disk reserve ([limits] disk_free_min_bytes,
// 0: off) with data_dir's filesystem at startup. A reserve at or above the
// filesystem's size can never be met: every write that grows the store
// would be refused NO_SPACE from the first, which an operator would
// otherwise learn from clients (an outside check: kvnode started silently
// so). That is an error naming the key. A filesystem that has less free
// than the reserve now is a warning (returned, for the log): writes that
// grow the store are refused until room is made, which is the reserve
// doing its job. statfs is space.FilesystemBytes (tests plant their own).
func checkReserve(dataDir string, reserve int64, statfs func(string) (size, free int64, err error)) (warning string, err error) {
	if reserve <= 0 {
		return "", nil
	}
	size, free, err := statfs(dataDir)
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
