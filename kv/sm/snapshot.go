package sm

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

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
	s.mu.Lock()
	if s.closed {
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
		err := writeSnapshot(pw, snap, slot)
		snap.Close()
		pw.CloseWithError(err)
		s.snapMu.Lock()
		delete(s.snaps, pr)
		s.snapMu.Unlock()
	}()
	return pr, slot, nil
}

func writeSnapshot(w io.Writer, snap *pebble.Snapshot, slot uint64) error {
	h := xxhash.New()
	bw := bufio.NewWriterSize(io.MultiWriter(w, h), snapWriteBufferSize)
	bw.Write(snapshotMagic)
	bw.Write(binary.BigEndian.AppendUint64(nil, slot))
	it, err := snap.NewIter(&pebble.IterOptions{UpperBound: keyspaceEnd})
	if err != nil {
		return fmt.Errorf("sm: snapshot iterator: %w", err)
	}
	defer it.Close()
	var count uint64
	var hdr [5]byte
	for it.First(); it.Valid(); it.Next() {
		if bytes.Equal(it.Key(), restoringKey) {
			continue
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("sm: snapshot value: %w", err)
		}
		hdr[0] = snapRecord
		binary.BigEndian.PutUint32(hdr[1:], uint32(len(it.Key())))
		bw.Write(hdr[:])
		bw.Write(it.Key())
		bw.Write(binary.BigEndian.AppendUint32(nil, uint32(len(v))))
		if _, err := bw.Write(v); err != nil {
			return err
		}
		count++
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("sm: snapshot iterator: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	end := []byte{snapEnd}
	end = binary.BigEndian.AppendUint64(end, count)
	end = binary.BigEndian.AppendUint64(end, h.Sum64())
	_, err = w.Write(end)
	return err
}

// Restore replaces the whole state with the snapshot stream r. It first
// marks the store as restoring and deletes everything; only after the
// stream has been read and verified is the marker removed and the result
// flushed. If it fails, the SM refuses to apply (and a reopen refuses to
// open) until a later Restore succeeds.
func (s *SM) Restore(r io.Reader) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.broken = ErrRestoreUnfinish
	b := s.db.NewBatch()
	b.Set(restoringKey, nil, nil)
	b.DeleteRange([]byte{}, keyspaceEnd, nil)
	b.Set(restoringKey, nil, nil)
	if err := b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("sm: restore: clearing: %w", err)
	}
	if err := s.db.Flush(); err != nil {
		return fmt.Errorf("sm: restore: flushing: %w", err)
	}
	slot, err := s.readSnapshot(r)
	if err != nil {
		return err
	}
	b = s.db.NewBatch()
	b.Delete(restoringKey, nil)
	if err := b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("sm: restore: finishing: %w", err)
	}
	if err := s.db.Flush(); err != nil {
		return fmt.Errorf("sm: restore: flushing: %w", err)
	}
	if err := s.load(); err != nil {
		return err
	}
	if s.applied.Load() != slot {
		return fmt.Errorf("%w: header slot %d, stored applied slot %d", ErrBadSnapshot, slot, s.applied.Load())
	}
	s.broken = nil
	return nil
}

func (s *SM) readSnapshot(r io.Reader) (uint64, error) {
	h := xxhash.New()
	br := bufio.NewReaderSize(r, snapWriteBufferSize)
	tr := io.TeeReader(br, h)
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadSnapshot}, args...)...)
	}
	var head [16]byte
	if _, err := io.ReadFull(tr, head[:]); err != nil {
		return 0, bad("header: %v", err)
	}
	if !bytes.Equal(head[:8], snapshotMagic) {
		return 0, bad("magic %q", head[:8])
	}
	slot := binary.BigEndian.Uint64(head[8:])
	batch := s.db.NewBatch()
	defer func() { batch.Close() }()
	var count uint64
	for {
		kind, err := br.ReadByte()
		if err != nil {
			return 0, bad("record kind: %v", err)
		}
		if kind == snapEnd {
			break
		}
		h.Write([]byte{kind})
		if kind != snapRecord {
			return 0, bad("record kind %d", kind)
		}
		key, err := readField(tr, len(keyspaceEnd))
		if err != nil {
			return 0, bad("key: %v", err)
		}
		val, err := readField(tr, snapValueBytesMax)
		if err != nil {
			return 0, bad("value: %v", err)
		}
		if bytes.Compare(key, keyspaceEnd) >= 0 || bytes.Equal(key, restoringKey) {
			return 0, bad("key %x outside the keyspace", key)
		}
		batch.Set(key, val, nil)
		count++
		if batch.Len() >= restoreBatchBytesMax {
			if err := batch.Commit(pebble.NoSync); err != nil {
				return 0, fmt.Errorf("sm: restore: writing: %w", err)
			}
			batch.Close()
			batch = s.db.NewBatch()
		}
	}
	sum := h.Sum64()
	var tail [16]byte
	if _, err := io.ReadFull(br, tail[:]); err != nil {
		return 0, bad("end record: %v", err)
	}
	if got := binary.BigEndian.Uint64(tail[:]); got != count {
		return 0, bad("end record counts %d records, read %d", got, count)
	}
	if got := binary.BigEndian.Uint64(tail[8:]); got != sum {
		return 0, bad("checksum %#x, computed %#x", got, sum)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		return 0, bad("trailing bytes after the end record")
	}
	if err := batch.Commit(pebble.NoSync); err != nil {
		return 0, fmt.Errorf("sm: restore: writing: %w", err)
	}
	return slot, nil
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
