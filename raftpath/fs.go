package raftpath

import (
	"fmt"
	"io"
	"os"
)

// fileSystem is everything the raft path persists through before it
// acknowledges: the WAL's segments (entries, hard state, snapshot
// records) and the snapshot files a follower receives. Production uses
// osFS, the operating system. The power-loss tests (powerloss_test.go)
// put simulated media behind it that keep only what was fdatasynced, and
// directory entries only once their directory was synced, so that a
// crash there loses what a power cut loses (a SIGKILL keeps the page
// cache).
//
// The state machine (kv/sm: Pebble without a WAL of its own) is not
// behind this seam. It keeps a prefix of what was applied, made durable by
// Flush before the WAL records a snapshot there; past that point the WAL
// alone must hold every acknowledged entry.
type fileSystem interface {
	// MkdirAll creates dir and its parents.
	MkdirAll(dir string) error
	// ReadDir returns the names of the entries of dir.
	ReadDir(dir string) ([]string, error)
	// Open opens path for reading.
	Open(path string) (readFile, error)
	// Create creates path for writing at offset 0: with excl it must not
	// exist yet, otherwise an existing file is truncated.
	Create(path string, excl bool) (writeFile, error)
	// OpenWrite opens the existing path for writing at offset 0.
	OpenWrite(path string) (writeFile, error)
	// Truncate sets the size of path.
	Truncate(path string, size int64) error
	// Remove removes path.
	Remove(path string) error
	// Rename renames from to to, replacing to.
	Rename(from, to string) error
	// SyncDir makes the entries of dir (creates, renames, removes)
	// durable.
	SyncDir(dir string) error
}

// readFile is a file opened for reading.
type readFile interface {
	io.ReadCloser
	// Size returns the file's size in bytes.
	Size() (int64, error)
}

// writeFile is a file opened for writing.
type writeFile interface {
	io.Writer
	Seek(offset int64, whence int) (int64, error)
	// Truncate sets the file's size.
	Truncate(size int64) error
	// Datasync is fdatasync: when it returns, the data written so far and
	// the metadata needed to read it back are durable.
	Datasync() error
	// Preallocate allocates the file's blocks up to bytes, keeping its
	// data (see preallocate).
	Preallocate(bytes int64) error
	Close() error
}

// osFS is the operating system's file system.
type osFS struct{}

var _ fileSystem = osFS{}

func (osFS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o750) }

func (osFS) ReadDir(dir string) ([]string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(des))
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names, nil
}

func (osFS) Open(path string) (readFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	return osReadFile{f}, nil
}

func (osFS) Create(path string, excl bool) (writeFile, error) {
	flag := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if excl {
		flag = os.O_CREATE | os.O_WRONLY | os.O_EXCL
	}
	f, err := os.OpenFile(path, flag, 0o640)
	if err != nil {
		return nil, err
	}
	return osWriteFile{f}, nil
}

func (osFS) OpenWrite(path string) (writeFile, error) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	return osWriteFile{f}, nil
}

func (osFS) Truncate(path string, size int64) error { return os.Truncate(path, size) }
func (osFS) Remove(path string) error               { return os.Remove(path) }
func (osFS) Rename(from, to string) error           { return os.Rename(from, to) }
func (osFS) SyncDir(dir string) error               { return syncDir(dir) }

type osReadFile struct{ *os.File }

func (f osReadFile) Size() (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

type osWriteFile struct{ *os.File }

func (f osWriteFile) Datasync() error               { return fdatasync(f.File) }
func (f osWriteFile) Preallocate(bytes int64) error { return preallocate(f.File, bytes) }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
