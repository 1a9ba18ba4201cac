package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// rssBytes returns the resident set size of process pid, from the VmRSS
// line of /proc/PID/status.
func rssBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseVmRSS(b)
}

// diskBytes returns the disk space the files under path take (allocated
// blocks, as du counts them: a sparse or preallocated file counts what it
// holds on disk, and a file with several links under path counts once,
// as a delta snapshot's staging, a checkpoint of hard links, does). A
// missing path is 0.
func diskBytes(path string) (int64, error) {
	var total int64
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed while walking (compaction, WAL segments)
			}
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if err == unix.ENOENT {
				return nil
			}
			return err
		}
		if st.Nlink > 1 && !d.IsDir() {
			id := inode{uint64(st.Dev), st.Ino}
			if seen[id] {
				return nil
			}
			seen[id] = true
		}
		total += st.Blocks * 512
		return nil
	})
	if os.IsNotExist(err) {
		return 0, nil
	}
	return total, err
}

// readHostCPU reads the machine's CPU time so far (host_steal.go); a
// failed read gives a hostCPU that is not ok.
func readHostCPU() hostCPU {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostCPU{}
	}
	h, _ := parseProcStatCPU(b)
	return h
}
