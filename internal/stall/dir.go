package stall

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Trace files are named
//
//	stall-<UTC time, µs>-<path>-<stage>-slot<N>.trace
//
// so that names sort in the order the stalls were seen. A snapshot is
// written under a temporary name (tmpPrefix + the final name) and renamed
// when complete, so a file with the final name is always a whole trace.
const (
	filePrefix = "stall-"
	fileSuffix = ".trace"
	tmpPrefix  = ".tmp-"
	timeLayout = "20060102T150405.000000Z"
)

// testingNoPrune plants a writer that never prunes the directory (its
// test shows the bound's checker catches it). Never set outside tests.
var testingNoPrune bool

// errFileTooLarge: the recorder's window did not fit in one file's share
// of the directory (FileBytesMax).
var errFileTooLarge = errors.New("stall: the trace exceeds the file size limit (trace_bytes_max / trace_files_max)")

// prepareDir creates dir and removes temporary files a crash left there.
func prepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("creating the stall trace directory: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("reading the stall trace directory: %w", err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix+filePrefix) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

// fileName names the trace of ev seen at at.
func fileName(ev Event, at time.Time) string {
	return fmt.Sprintf("%s%s-%s-%s-slot%d%s", filePrefix, at.UTC().Format(timeLayout), clean(ev.Path), clean(ev.Stage), ev.Slot, fileSuffix)
}

// clean keeps a label's letters, digits and underscores (labels are the
// runtime's constants; this only keeps a name a name).
func clean(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) > 32 {
		b = b[:32]
	}
	return string(b)
}

// traceFile is one trace file in the directory.
type traceFile struct {
	name  string
	bytes int64
}

// listTraces returns the trace files in dir, oldest first.
func listTraces(dir string) ([]traceFile, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []traceFile
	for _, e := range ents {
		n := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(n, filePrefix) || !strings.HasSuffix(n, fileSuffix) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, traceFile{name: n, bytes: info.Size()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// prune removes the oldest trace files until at most files remain holding
// at most bytes.
func prune(dir string, files int, bytes int64) error {
	ts, err := listTraces(dir)
	if err != nil {
		return err
	}
	var total int64
	for _, t := range ts {
		total += t.bytes
	}
	for len(ts) > 0 && (len(ts) > files || total > bytes) {
		if err := os.Remove(filepath.Join(dir, ts[0].name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		total -= ts[0].bytes
		ts = ts[1:]
	}
	return nil
}

// writeTrace snapshots rec into a new file of cfg.Dir and returns its path
// and size.
//
// Invariant (the directory bound): before the snapshot the directory is
// pruned to FilesMax-1 files and BytesMax-FileBytesMax bytes, and the
// snapshot is cut off at FileBytesMax bytes, so the directory never holds
// more than FilesMax trace files nor more than BytesMax bytes of them.
func writeTrace(cfg Config, rec *recorder, ev Event, at time.Time) (string, int64, error) {
	fileMax := cfg.FileBytesMax()
	if !testingNoPrune {
		if err := prune(cfg.Dir, cfg.FilesMax-1, cfg.BytesMax-fileMax); err != nil {
			return "", 0, fmt.Errorf("pruning the stall trace directory: %w", err)
		}
	}
	name := fileName(ev, at)
	final := filepath.Join(cfg.Dir, name)
	tmp := filepath.Join(cfg.Dir, tmpPrefix+name)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return "", 0, err
	}
	w := &capWriter{w: f, left: fileMax}
	n, err := rec.writeTo(w)
	if w.over {
		err = errFileTooLarge
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, final)
	}
	if err != nil {
		os.Remove(tmp)
		return "", 0, err
	}
	return final, n, nil
}

// capWriter writes at most left bytes to w, then fails.
type capWriter struct {
	w    io.Writer
	left int64
	over bool
}

func (c *capWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		c.over = true
		return 0, errFileTooLarge
	}
	n, err := c.w.Write(p)
	c.left -= int64(n)
	return n, err
}
