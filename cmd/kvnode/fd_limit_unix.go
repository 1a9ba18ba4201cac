//go:build unix

package main

import "syscall"

// nofileLimit is RLIMIT_NOFILE's soft limit (0 when it cannot be read).
func nofileLimit() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return uint64(lim.Cur)
}
