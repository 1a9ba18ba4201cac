package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// fdatasync flushes f's data (and only the metadata needed to read it
// back) to the disk.
func fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
