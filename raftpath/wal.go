package raftpath

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// WAL on-disk format. The WAL is a sequence of segment files in one
// directory, named by a 16-digit decimal sequence number and ".wal". Each
// segment is a sequence of records:
//
//	offset size field
//	0      4    length   payload bytes (big-endian)
//	4      4    crc      CRC-32C of the type byte and the payload
//	8      1    type     recEntry | recHardState | recSnapshot
//	9      ...  payload  protobuf: raftpb.Entry, raftpb.HardState, raftpb.SnapshotMetadata
//
// The constants are part of the format. A segment starts with the latest
// snapshot record and hard state when it is created, so that older segments
// can be removed once a snapshot covers every entry they hold.
//
// Segments are preallocated (fallocate) to walSegmentBytesMax, as etcd's
// are: appending inside allocated space does not change the file size, so
// fdatasync flushes data without a filesystem journal commit. An all-zero
// record header marks the end of a segment's log (a written header always
// has a non-zero type). Finished segments and a cleanly closed WAL are
// trimmed to their log.
//
// Recovery reads every segment in order. A record that does not verify in
// the last segment (a torn or zeroed tail from a crash mid-append) ends
// the log there and is cut off; nothing after it was ever acknowledged,
// because acknowledgement waits for fdatasync. A bad record in an earlier
// segment is corruption and an error.
const (
	recEntry     = 1
	recHardState = 2
	recSnapshot  = 3

	walRecordHeaderBytes = 9
	// walRecordBytesMax bounds one record: an entry carries one client
	// command (at most a frame) plus its envelope.
	walRecordBytesMax = 8 << 20
	// walSegmentBytesMax is the size past which the WAL starts a new
	// segment.
	walSegmentBytesMax = 64 << 20
	walSuffix          = ".wal"
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Errors of the WAL.
var (
	ErrWALCorrupt = errors.New("raftpath: wal corrupt")
)

// walSegment is one segment file.
type walSegment struct {
	seq      uint64
	path     string
	maxIndex uint64 // highest entry index it holds (0: none)
}

// WAL is the raft write-ahead log. It is used by one goroutine (the Ready
// loop).
type WAL struct {
	fs   fileSystem
	dir  string
	segs []walSegment // in order; the last is open for appends
	f    writeFile
	w    *bufio.Writer
	size int64

	snap *pb.SnapshotMetadata // latest snapshot record
	hs   *pb.HardState        // latest hard state record
	buf  []byte
}

// Recovered is what OpenWAL read back.
type Recovered struct {
	Snapshot  *pb.SnapshotMetadata // nil on a fresh WAL
	HardState *pb.HardState        // nil on a fresh WAL
	// Entries follow Snapshot.Index contiguously.
	Entries []*pb.Entry
	// CutBytes is the length of a bad tail removed from the last segment.
	CutBytes int64
}

// OpenWAL opens (or creates) the WAL in dir and returns what it holds.
func OpenWAL(dir string) (*WAL, *Recovered, error) { return openWAL(osFS{}, dir) }

// openWAL is OpenWAL on the file system fs.
func openWAL(fs fileSystem, dir string) (*WAL, *Recovered, error) {
	if err := fs.MkdirAll(dir); err != nil {
		return nil, nil, fmt.Errorf("creating wal dir: %w", err)
	}
	names, err := fs.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("listing wal dir: %w", err)
	}
	w := &WAL{fs: fs, dir: dir}
	for _, n := range names {
		if !strings.HasSuffix(n, walSuffix) {
			continue
		}
		seq, err := strconv.ParseUint(strings.TrimSuffix(n, walSuffix), 10, 64)
		if err != nil {
			continue
		}
		w.segs = append(w.segs, walSegment{seq: seq, path: filepath.Join(dir, n)})
	}
	sort.Slice(w.segs, func(i, j int) bool { return w.segs[i].seq < w.segs[j].seq })
	rec := &Recovered{}
	var end int64 // where the last segment's log ends
	for i := range w.segs {
		last := i == len(w.segs)-1
		e, cut, err := w.replay(&w.segs[i], rec, last)
		if err != nil {
			return nil, nil, err
		}
		rec.CutBytes += cut
		end = e
	}
	if rec.Snapshot != nil {
		// Entries at or below the snapshot are in the state machine.
		for len(rec.Entries) > 0 && rec.Entries[0].GetIndex() <= rec.Snapshot.GetIndex() {
			rec.Entries = rec.Entries[1:]
		}
	}
	if len(rec.Entries) > 0 {
		want := uint64(1)
		if rec.Snapshot != nil {
			want = rec.Snapshot.GetIndex() + 1
		}
		if rec.Entries[0].GetIndex() != want {
			return nil, nil, fmt.Errorf("%w: first entry %d does not follow snapshot %d", ErrWALCorrupt, rec.Entries[0].GetIndex(), want-1)
		}
	}
	if rec.Snapshot != nil && rec.HardState != nil && rec.HardState.GetCommit() < rec.Snapshot.GetIndex() {
		// A snapshot holds only committed entries, so its index is a
		// lower bound of the commit. A snapshot received from the leader
		// is followed by the hard state raising the commit to it, which
		// raft does not ask to sync (a commit change alone): a power
		// loss can keep the synced snapshot record and lose that hard
		// state, and raft refuses to restart with its commit below the
		// snapshot. (etcd's WAL instead falls back to an older snapshot,
		// ValidSnapshotEntries.)
		rec.HardState.Commit = proto.Uint64(rec.Snapshot.GetIndex())
	}
	w.snap, w.hs = rec.Snapshot, rec.HardState
	if len(w.segs) == 0 {
		if err := w.newSegment(1); err != nil {
			return nil, nil, err
		}
	} else {
		s := w.segs[len(w.segs)-1]
		f, err := fs.OpenWrite(s.path)
		if err != nil {
			return nil, nil, fmt.Errorf("opening wal segment: %w", err)
		}
		if err := f.Preallocate(walSegmentBytesMax); err != nil {
			f.Close()
			return nil, nil, err
		}
		if _, err := f.Seek(end, io.SeekStart); err != nil {
			f.Close()
			return nil, nil, err
		}
		w.f, w.w, w.size = f, bufio.NewWriterSize(f, 256<<10), end
	}
	return w, rec, nil
}

// replay reads one segment into rec and returns the offset where its log
// ends; in the last segment a bad record cuts the file there.
func (w *WAL) replay(s *walSegment, rec *Recovered, last bool) (end, cut int64, err error) {
	f, err := w.fs.Open(s.path)
	if err != nil {
		return 0, 0, fmt.Errorf("opening wal segment: %w", err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return 0, 0, err
	}
	r := bufio.NewReaderSize(f, 256<<10)
	var off int64
	for {
		typ, payload, n, rerr := readRecord(r)
		if rerr == io.EOF {
			return off, 0, nil
		}
		if rerr == nil {
			rerr = applyRecord(typ, payload, rec, s)
		}
		if rerr != nil {
			if !last {
				return 0, 0, fmt.Errorf("%w: segment %s at offset %d: %v", ErrWALCorrupt, s.path, off, rerr)
			}
			// Cut the bad tail (zeroing it keeps the preallocation, and
			// a later append overwrites it from off).
			if err := w.fs.Truncate(s.path, off); err != nil {
				return 0, 0, fmt.Errorf("cutting the wal tail: %w", err)
			}
			return off, size - off, nil
		}
		off += n
	}
}

// readRecord reads one record; io.EOF only at a clean end.
func readRecord(r *bufio.Reader) (typ byte, payload []byte, n int64, err error) {
	var h [walRecordHeaderBytes]byte
	if k, err := io.ReadFull(r, h[:]); err != nil {
		if err == io.EOF && k == 0 {
			return 0, nil, 0, io.EOF
		}
		return 0, nil, 0, fmt.Errorf("short record header")
	}
	// A zero header is preallocated space: the log ends here. (A written
	// header has a non-zero type.)
	if h == [walRecordHeaderBytes]byte{} {
		return 0, nil, 0, io.EOF
	}
	length := binary.BigEndian.Uint32(h[0:4])
	if length > walRecordBytesMax {
		return 0, nil, 0, fmt.Errorf("record of %d bytes exceeds %d", length, walRecordBytesMax)
	}
	payload = make([]byte, length)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, 0, fmt.Errorf("short record payload")
	}
	crc := crc32.Update(crc32.Checksum(h[8:9], crcTable), crcTable, payload)
	if crc != binary.BigEndian.Uint32(h[4:8]) {
		return 0, nil, 0, fmt.Errorf("checksum mismatch")
	}
	return h[8], payload, int64(walRecordHeaderBytes) + int64(length), nil
}

// applyRecord folds one record into rec.
func applyRecord(typ byte, payload []byte, rec *Recovered, s *walSegment) error {
	switch typ {
	case recEntry:
		e := &pb.Entry{}
		if err := proto.Unmarshal(payload, e); err != nil {
			return fmt.Errorf("entry: %v", err)
		}
		i := e.GetIndex()
		if i == 0 {
			return errors.New("entry index 0")
		}
		// Raft may overwrite an uncommitted suffix: a new entry at index i
		// replaces every entry from i on. A gap (entries of a removed
		// segment) restarts the list; OpenWAL checks the result follows
		// the snapshot.
		if n := len(rec.Entries); n > 0 {
			first := rec.Entries[0].GetIndex()
			switch {
			case i < first:
				rec.Entries = rec.Entries[:0]
			case i <= rec.Entries[n-1].GetIndex():
				rec.Entries = rec.Entries[:i-first]
			case i > rec.Entries[n-1].GetIndex()+1:
				rec.Entries = rec.Entries[:0]
			}
		}
		rec.Entries = append(rec.Entries, e)
		s.maxIndex = max(s.maxIndex, i)
	case recHardState:
		hs := &pb.HardState{}
		if err := proto.Unmarshal(payload, hs); err != nil {
			return fmt.Errorf("hard state: %v", err)
		}
		rec.HardState = hs
	case recSnapshot:
		sm := &pb.SnapshotMetadata{}
		if err := proto.Unmarshal(payload, sm); err != nil {
			return fmt.Errorf("snapshot: %v", err)
		}
		if rec.Snapshot == nil || sm.GetIndex() >= rec.Snapshot.GetIndex() {
			rec.Snapshot = sm
		}
	default:
		return fmt.Errorf("unknown record type %d", typ)
	}
	return nil
}

// newSegment starts segment seq and writes the current snapshot and hard
// state at its head.
func (w *WAL) newSegment(seq uint64) error {
	if w.f != nil {
		if err := w.sync(); err != nil {
			return err
		}
		// Give back the unused preallocation of the finished segment.
		if err := w.f.Truncate(w.size); err != nil {
			return fmt.Errorf("trimming wal segment: %w", err)
		}
		if err := w.f.Close(); err != nil {
			return fmt.Errorf("closing wal segment: %w", err)
		}
	}
	path := filepath.Join(w.dir, fmt.Sprintf("%016d%s", seq, walSuffix))
	f, err := w.fs.Create(path, true)
	if err != nil {
		return fmt.Errorf("creating wal segment: %w", err)
	}
	if err := f.Preallocate(walSegmentBytesMax); err != nil {
		f.Close()
		return err
	}
	w.f, w.w, w.size = f, bufio.NewWriterSize(f, 256<<10), 0
	w.segs = append(w.segs, walSegment{seq: seq, path: path})
	if w.snap != nil {
		if err := w.write(recSnapshot, w.snap); err != nil {
			return err
		}
	}
	if w.hs != nil {
		if err := w.write(recHardState, w.hs); err != nil {
			return err
		}
	}
	if err := w.sync(); err != nil {
		return err
	}
	// The new file's directory entry must be durable too.
	return w.fs.SyncDir(w.dir)
}

func (w *WAL) write(typ byte, m proto.Message) error {
	var err error
	w.buf, err = proto.MarshalOptions{}.MarshalAppend(w.buf[:0], m)
	if err != nil {
		return fmt.Errorf("encoding wal record: %w", err)
	}
	if len(w.buf) > walRecordBytesMax {
		return fmt.Errorf("wal record of %d bytes exceeds %d", len(w.buf), walRecordBytesMax)
	}
	var h [walRecordHeaderBytes]byte
	binary.BigEndian.PutUint32(h[0:4], uint32(len(w.buf)))
	h[8] = typ
	binary.BigEndian.PutUint32(h[4:8], crc32.Update(crc32.Checksum(h[8:9], crcTable), crcTable, w.buf))
	if _, err := w.w.Write(h[:]); err != nil {
		return fmt.Errorf("writing wal: %w", err)
	}
	if _, err := w.w.Write(w.buf); err != nil {
		return fmt.Errorf("writing wal: %w", err)
	}
	w.size += int64(walRecordHeaderBytes + len(w.buf))
	return nil
}

func (w *WAL) sync() error {
	if err := w.w.Flush(); err != nil {
		return fmt.Errorf("writing wal: %w", err)
	}
	if err := w.f.Datasync(); err != nil {
		return fmt.Errorf("fdatasync of the wal: %w", err)
	}
	return nil
}

// Save appends the hard state (when not nil) and entries, then
// fdatasyncs when mustSync. Contract (raft's): the caller sends the
// messages of the same Ready only after Save returns.
func (w *WAL) Save(hs *pb.HardState, ents []*pb.Entry, mustSync bool) error {
	for _, e := range ents {
		if err := w.write(recEntry, e); err != nil {
			return err
		}
		w.segs[len(w.segs)-1].maxIndex = max(w.segs[len(w.segs)-1].maxIndex, e.GetIndex())
	}
	if hs != nil {
		if err := w.write(recHardState, hs); err != nil {
			return err
		}
		w.hs = hs
	}
	if mustSync {
		if err := w.sync(); err != nil {
			return err
		}
	} else if err := w.w.Flush(); err != nil {
		return fmt.Errorf("writing wal: %w", err)
	}
	if w.size > walSegmentBytesMax {
		return w.newSegment(w.segs[len(w.segs)-1].seq + 1)
	}
	return nil
}

// SaveSnapshot records that the state machine holds everything up to
// meta.Index (durably: the caller flushed it first), syncs, and removes
// segments whose entries are all covered.
func (w *WAL) SaveSnapshot(meta *pb.SnapshotMetadata) error {
	if err := w.write(recSnapshot, meta); err != nil {
		return err
	}
	if err := w.sync(); err != nil {
		return err
	}
	w.snap = meta
	keep := w.segs[:0]
	for i, s := range w.segs {
		if i < len(w.segs)-1 && s.maxIndex <= meta.GetIndex() {
			if err := w.fs.Remove(s.path); err != nil {
				return fmt.Errorf("removing wal segment: %w", err)
			}
			continue
		}
		keep = append(keep, s)
	}
	w.segs = keep
	return nil
}

// Segments returns the number of segment files (tests).
func (w *WAL) Segments() int { return len(w.segs) }

// Close flushes, syncs and closes the WAL.
func (w *WAL) Close() error {
	if w.f == nil {
		return nil
	}
	err := w.sync()
	if terr := w.f.Truncate(w.size); err == nil {
		err = terr
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.f = nil
	return err
}
