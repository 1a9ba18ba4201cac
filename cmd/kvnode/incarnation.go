package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// incarnationFileName is the file in data_dir that records the sender
// incarnation this node last sealed consensus packets with
// (kv/replica/auth.go): decimal nanoseconds since 1970, one line.
const incarnationFileName = "incarnation"

// incarnationFileBytesMax bounds what nextIncarnation reads of the file
// (20 digits and a newline fit).
const incarnationFileBytesMax = 64

// nextIncarnation returns the incarnation of this process start and
// records it in dir before returning (written to a temporary file,
// fsynced, renamed over the old one, the directory fsynced). It is now in
// nanoseconds since 1970, or one more than the recorded one when the
// clock says less: peers drop every packet of an incarnation older than
// one they have seen from the sender (the replay window), so a node
// restarted with its clock stepped back (a VM restored, an RTC behind
// before NTP syncs) would be refused by every peer until they restarted.
// behind reports that the clock was behind the record. A file that does
// not hold one number is an error that names it: it is not guessed past.
func nextIncarnation(dir string, now time.Time) (inc uint64, behind bool, err error) {
	path := filepath.Join(dir, incarnationFileName)
	inc = uint64(now.UnixNano())
	f, err := os.Open(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return 0, false, fmt.Errorf("reading %s: %w", path, err)
	default:
		buf := make([]byte, incarnationFileBytesMax+1)
		n, rerr := f.Read(buf)
		f.Close()
		if rerr != nil && n == 0 {
			return 0, false, fmt.Errorf("reading %s: %w", path, rerr)
		}
		last, perr := strconv.ParseUint(strings.TrimSpace(string(buf[:n])), 10, 64)
		if n > incarnationFileBytesMax || perr != nil || last == 0 || last == ^uint64(0) {
			return 0, false, fmt.Errorf("%s does not hold one incarnation number (%d bytes); with the clock right, remove it", path, n)
		}
		if inc <= last {
			inc, behind = last+1, true
		}
	}
	if err := writeFileSynced(path, []byte(strconv.FormatUint(inc, 10)+"\n")); err != nil {
		return 0, false, fmt.Errorf("recording the incarnation: %w", err)
	}
	return inc, behind, nil
}

// writeFileSynced replaces path with b durably: a temporary file beside
// it, fsynced, renamed over path, then the directory fsynced.
func writeFileSynced(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
