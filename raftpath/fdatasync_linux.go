package raftpath

import (
	"os"

	"golang.org/x/sys/unix"
)

// fdatasync makes f's data (and the metadata needed to read it) durable,
// as etcd's WAL does on Linux.
func fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
