//go:build !linux

package raftpath

import "os"

// preallocate is a no-op where fallocate is not available: the file grows
// as it is written (each fdatasync then also commits the new size).
func preallocate(f *os.File, bytes int64) error { return nil }
