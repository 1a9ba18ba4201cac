package sm

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cespare/xxhash/v2"
	"github.com/cockroachdb/pebble/v2"
)

// Snapshot stream format. Rather than shipping a Pebble checkpoint (a
// directory of files tied to Pebble's version and options), a snapshot is a
// compact stream of every key of a consistent Pebble snapshot, data and
// metadata (applied slot, client table) alike:
//
//	magic "SYNODSM\x01" (8 bytes) | applied slot u64
//	repeated: kind u8 = 1 | key length u32 | key | value length u32 | value
//	end:      kind u8 = 0 | record count u64 | xxhash64 u64 of every byte before this end record
//
// Restore rejects a stream with a bad magic, an oversized record, a wrong
// count or checksum, or trailing bytes (ErrBadSnapshot).
var snapshotMagic = []byte("SYNODSM\x01")

const (
	snapRecord          = 1
	snapEnd             = 0
	snapValueBytesMax   = 64 << 20 // a stored value (client entries, data) is far below this
	snapWriteBufferSize = 256 << 10
)

// Snapshot returns a stream of the state as of the last Apply and the
// applied slot it reflects. The stream is produced while it is read;
// close it when done (Close of the SM aborts open streams).
func (s *SM) Snapshot() (io.ReadCloser, uint64, error) {
	return s.stream(writeSnapshot)
}

// stream runs write over a Pebble snapshot of the state as of the last
// Apply, into a pipe it returns with the applied slot (Snapshot and
// SnapshotDelta).
func (s *SM) stream(write func(w io.Writer, snap *pebble.Snapshot, slot uint64) error) (io.ReadCloser, uint64, error) {
	s.mu.Lock()
	if s.closed || s.dbClosed {
		s.mu.Unlock()
		return nil, 0, ErrClosed
	}
	snap := s.db.NewSnapshot()
	slot := s.applied.Load()
	pr, pw := io.Pipe()
	s.snapMu.Lock()
	s.snaps[pr] = struct{}{}
	s.snapWG.Add(1)
	s.snapMu.Unlock()
	s.mu.Unlock()
	go func() {
		defer s.snapWG.Done()
		err := write(pw, snap, slot)
		snap.Close()
		pw.CloseWithError(err)
		s.snapMu.Lock()
		delete(s.snaps, pr)
		s.snapMu.Unlock()
	}()
	return pr, slot, nil
}

func writeSnapshot(w io.Writer, snap *pebble.Snapshot, slot uint64) error {
	enc := newSnapEncoder(w, snapshotMagic, slot)
	it, err := snap.NewIter(&pebble.IterOptions{UpperBound: keyspaceEnd})
	if err != nil {
		return fmt.Errorf("sm: snapshot iterator: %w", err)
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		if localKey(it.Key()) {
			continue
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("sm: snapshot value: %w", err)
		}
		if err := enc.record(it.Key(), v); err != nil {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("sm: snapshot iterator: %w", err)
	}
	return enc.end()
}

// snapEncoder writes a snapshot stream in the format above (or a delta
// stream, snapshot_delta.go): the header when made, a record per call,
// the end record (count, checksum, and a delta's state hash) last.
// writeSnapshot and writeDelta are its users; tests build streams with it.
type snapEncoder struct {
	w     io.Writer
	h     *xxhash.Digest
	bw    *bufio.Writer // to w and h
	count uint64
	hdr   [5]byte
}

func newSnapEncoder(w io.Writer, magic []byte, slot uint64) *snapEncoder {
	e := &snapEncoder{w: w, h: xxhash.New()}
	e.bw = bufio.NewWriterSize(io.MultiWriter(w, e.h), snapWriteBufferSize)
	e.bw.Write(magic)
	e.bw.Write(binary.BigEndian.AppendUint64(nil, slot))
	return e
}

// record appends one key/value record; the first error of the writer is
// returned (by this call or a later one).
func (e *snapEncoder) record(key, val []byte) error {
	e.hdr[0] = snapRecord
	binary.BigEndian.PutUint32(e.hdr[1:], uint32(len(key)))
	e.bw.Write(e.hdr[:])
	e.bw.Write(key)
	binary.BigEndian.PutUint32(e.hdr[:4], uint32(len(val)))
	e.bw.Write(e.hdr[:4])
	_, err := e.bw.Write(val)
	e.count++
	return err
}

// marker appends a one-byte record (a delta stream's keep or replace).
func (e *snapEncoder) marker(kind byte) error {
	return e.bw.WriteByte(kind)
}

// end flushes the records and writes the end record (outside the
// checksum it carries), extra (a delta's state hash) after the checksum.
func (e *snapEncoder) end(extra ...uint64) error {
	if err := e.bw.Flush(); err != nil {
		return err
	}
	end := []byte{snapEnd}
	end = binary.BigEndian.AppendUint64(end, e.count)
	end = binary.BigEndian.AppendUint64(end, e.h.Sum64())
	for _, x := range extra {
		end = binary.BigEndian.AppendUint64(end, x)
	}
	_, err := e.w.Write(end)
	return err
}

// Restore replaces the whole state with the snapshot stream r, verified
// before anything is replaced: it stages r (BeginStage, then the stream,
// then Finish: parsed into a fresh Pebble in dir + ".restore", checked
// record by record and against its count, checksum and applied slot,
// flushed, marked complete durably) and swaps the staged copy in
// (InstallStaged), whatever the slots.
//
// A bad stream returns ErrBadSnapshot and leaves the state as it was: the
// SM goes on applying and serving. A crash at any point leaves either the
// old state or the complete new one, which Open finishes swapping in
// (recoverRestore); never a partial state, and never a directory that
// refuses to open. Reads during Restore see the state before it; open
// Snapshot streams are aborted at the swap.
func (s *SM) Restore(r io.Reader) error {
	st, err := s.BeginStage()
	if err != nil {
		return fmt.Errorf("sm: restore: %w", err)
	}
	if _, err := io.Copy(st, r); err != nil {
		st.Abort()
		return err
	}
	slot, err := st.Finish()
	if err != nil {
		return err
	}
	if TestingCrashBeforeSwap != nil {
		TestingCrashBeforeSwap()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.dbClosed {
		return s.broken // a swap failed: only reopening recovers
	}
	return s.swapLocked(slot)
}

// TestingCrashBeforeSwap, when set (tests only), runs after a restore
// directory is complete and before it is swapped in; a test panics in it
// to leave the directories as a crash at that point would.
var TestingCrashBeforeSwap func()

// Restore's directories beside the live one.
const (
	restoreDirSuffix = ".restore" // a restore being written (complete once restoreDoneFile exists)
	oldDirSuffix     = ".old"     // the state a finished restore replaced
	restoreDoneFile  = "RESTORE-COMPLETE"
)

// swapRestored replaces dir with the complete dir.restore. Each step is
// one rename, so a crash between any two leaves a state recoverRestore
// finishes.
func swapRestored(dir string) error {
	old := dir + oldDirSuffix
	if err := os.RemoveAll(old); err != nil {
		return err
	}
	if _, err := os.Stat(dir); err == nil {
		if err := os.Rename(dir, old); err != nil {
			return err
		}
	}
	if err := os.Rename(dir+restoreDirSuffix, dir); err != nil {
		return err
	}
	if err := syncDir(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, restoreDoneFile)); err != nil {
		return err
	}
	return os.RemoveAll(old)
}

// recoverRestore finishes or discards what a staging or a swap left
// beside dir when the process stopped (see "Staged restores"): a complete
// staged copy is swapped in when the swap had begun (dir renamed away) or
// when its slot is above the live state's applied slot, and removed
// otherwise; an incomplete one is removed, and so is a replaced state left
// behind.
func recoverRestore(dir string) error {
	tmp := dir + restoreDirSuffix
	if staged, complete := readDoneFile(tmp); complete {
		swap := true
		if _, err := os.Stat(dir); err == nil && staged != 0 {
			live, err := appliedOf(dir)
			if err != nil {
				return fmt.Errorf("sm: reading the applied slot beside a staged snapshot: %w", err)
			}
			swap = staged > live
		}
		if swap {
			if err := swapRestored(dir); err != nil {
				return fmt.Errorf("sm: finishing an interrupted restore: %w", err)
			}
		} else if err := os.RemoveAll(tmp); err != nil {
			return fmt.Errorf("sm: removing a superseded staged snapshot: %w", err)
		}
	} else if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("sm: removing an unfinished restore: %w", err)
	}
	// A done file inside dir: the swap renamed the new state in and
	// stopped before removing the file.
	if err := os.Remove(filepath.Join(dir, restoreDoneFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.RemoveAll(dir + oldDirSuffix)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// checkApplied verifies that db's applied key holds slot, the stream's
// header slot.
func checkApplied(db *pebble.DB, slot uint64) error {
	v, closer, err := db.Get(appliedKey)
	if err != nil {
		return fmt.Errorf("%w: no applied slot (header slot %d): %v", ErrBadSnapshot, slot, err)
	}
	defer closer.Close()
	if len(v) != 8 || binary.BigEndian.Uint64(v) != slot {
		return fmt.Errorf("%w: header slot %d, stored applied slot %x", ErrBadSnapshot, slot, v)
	}
	return nil
}

// abortSnapshots ends every open Snapshot stream (their Pebble snapshots
// must be released before the database closes) and waits for them.
func (s *SM) abortSnapshots() {
	s.snapMu.Lock()
	for pr := range s.snaps {
		pr.CloseWithError(ErrClosed)
	}
	s.snapMu.Unlock()
	s.snapWG.Wait()
}

// scanSnapshot reads a snapshot stream from r and checks it record by
// record (kind, lengths, keys inside the keyspace) and against its end
// record's count and checksum, calling fn with every record in order (key
// and value are fresh slices); the stream must end right after its end
// record. It returns the header's applied slot and the record count. A
// malformed stream is an error wrapping ErrBadSnapshot; fn's errors are
// returned as they are.
func scanSnapshot(r io.Reader, fn func(key, val []byte) error) (slot, count uint64, err error) {
	sr := newStreamReader(r)
	head, err := sr.header(snapshotMagic, 8)
	if err != nil {
		return 0, 0, err
	}
	slot = binary.BigEndian.Uint64(head)
	for {
		kind, err := sr.kind()
		if err != nil {
			return 0, 0, err
		}
		if kind == snapEnd {
			break
		}
		if kind != snapRecord {
			return 0, 0, badSnapshot("record kind %d", kind)
		}
		key, val, err := sr.record()
		if err != nil {
			return 0, 0, err
		}
		if err := fn(key, val); err != nil {
			return 0, 0, err
		}
	}
	if _, err := sr.end(0); err != nil {
		return 0, 0, err
	}
	return slot, sr.count, nil
}

// badSnapshot is a malformed stream's error.
func badSnapshot(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadSnapshot}, args...)...)
}

// streamReader reads the parts every stream shares (snapshot.go's and a
// delta's, snapshot_delta.go): the header, record kinds, records and the
// end record, keeping the checksum of every byte before the end record
// and the count of records. Its errors wrap ErrBadSnapshot.
type streamReader struct {
	br    *bufio.Reader
	tr    io.Reader // br, every byte read added to sum
	sum   *xxhash.Digest
	count uint64
}

func newStreamReader(r io.Reader) *streamReader {
	sr := &streamReader{br: bufio.NewReaderSize(r, snapWriteBufferSize), sum: xxhash.New()}
	sr.tr = io.TeeReader(sr.br, sr.sum)
	return sr
}

// header reads magic and the n bytes after it, which it returns.
func (sr *streamReader) header(magic []byte, n int) ([]byte, error) {
	head := make([]byte, len(magic)+n)
	if _, err := io.ReadFull(sr.tr, head); err != nil {
		return nil, badSnapshot("header: %v", err)
	}
	if !bytes.Equal(head[:len(magic)], magic) {
		return nil, badSnapshot("magic %q", head[:len(magic)])
	}
	return head[len(magic):], nil
}

// kind reads the next record's kind (snapEnd is outside the checksum).
func (sr *streamReader) kind() (byte, error) {
	kind, err := sr.br.ReadByte()
	if err != nil {
		return 0, badSnapshot("record kind: %v", err)
	}
	if kind != snapEnd {
		sr.sum.Write([]byte{kind})
	}
	return kind, nil
}

// record reads a record's key and value (fresh slices) after its kind,
// checks the key is inside the keyspace and counts it.
func (sr *streamReader) record() (key, val []byte, err error) {
	if key, err = readField(sr.tr, len(keyspaceEnd)); err != nil {
		return nil, nil, badSnapshot("key: %v", err)
	}
	if val, err = readField(sr.tr, snapValueBytesMax); err != nil {
		return nil, nil, badSnapshot("value: %v", err)
	}
	if bytes.Compare(key, keyspaceEnd) >= 0 || localKey(key) {
		return nil, nil, badSnapshot("key %x outside the keyspace", key)
	}
	sr.count++
	return key, val, nil
}

// end reads the end record after its kind: the count and the checksum,
// which must match, then extra u64 fields (returned), then nothing.
func (sr *streamReader) end(extra int) ([]uint64, error) {
	want := sr.sum.Sum64()
	tail := make([]byte, 16+8*extra)
	if _, err := io.ReadFull(sr.br, tail); err != nil {
		return nil, badSnapshot("end record: %v", err)
	}
	if got := binary.BigEndian.Uint64(tail); got != sr.count {
		return nil, badSnapshot("end record counts %d records, read %d", got, sr.count)
	}
	if got := binary.BigEndian.Uint64(tail[8:]); got != want {
		return nil, badSnapshot("checksum %#x, computed %#x", got, want)
	}
	if _, err := sr.br.ReadByte(); !errors.Is(err, io.EOF) {
		return nil, badSnapshot("trailing bytes after the end record")
	}
	out := make([]uint64, extra)
	for i := range out {
		out[i] = binary.BigEndian.Uint64(tail[16+8*i:])
	}
	return out, nil
}

func readField(r io.Reader, max int) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	l := binary.BigEndian.Uint32(n[:])
	if uint64(l) > uint64(max) {
		return nil, fmt.Errorf("length %d exceeds %d", l, max)
	}
	p := make([]byte, l)
	_, err := io.ReadFull(r, p)
	return p, err
}
