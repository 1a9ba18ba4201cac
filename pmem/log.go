package pmem

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Mode is how stores to the region are made durable. See the package
// comment for what each survives.
type Mode string

const (
	// ModeDAX: a DAX file mapped MAP_SYNC; persist flushes cache lines.
	ModeDAX Mode = "dax"
	// ModeMsync: an ordinary file; persist is msync(MS_SYNC).
	ModeMsync Mode = "msync"
	// ModeShm: a file on tmpfs; persist is a store fence. Survives a
	// process crash, NOT a power loss.
	ModeShm Mode = "shm"
	// ModeDetect asks Open to choose with DetectMode.
	ModeDetect Mode = "detect"
)

// Survives says in words what a log in this mode survives, for reports.
func (m Mode) Survives() string {
	switch m {
	case ModeDAX, ModeMsync:
		return "process crash and power loss"
	case ModeShm:
		return "process crash only, NOT power loss"
	}
	return "unknown"
}

var (
	// ErrFull is matched (errors.Is) by the *FullError Append returns when
	// the batch does not fit before the head. The caller turns it into
	// backpressure and truncates.
	ErrFull = errors.New("pmem: log full")
	// ErrRecordTooLarge: a record exceeds RecordBytesMax or half the ring.
	ErrRecordTooLarge = errors.New("pmem: record too large")
	// ErrRecordType: Append was given type 0, RecordPad or an unknown type.
	ErrRecordType = errors.New("pmem: record type not appendable")
	// ErrBatchTooLarge: Append was given more than AppendBatchRecordsMax records.
	ErrBatchTooLarge = errors.New("pmem: append batch too large")
	// ErrRegionSize: the region size is out of bounds, unaligned or not the
	// size of the existing file.
	ErrRegionSize = errors.New("pmem: bad region size")
	// ErrClosed: the log was closed.
	ErrClosed = errors.New("pmem: log closed")
	// ErrDAXUnavailable: dax mode was asked for where MAP_SYNC is refused.
	ErrDAXUnavailable = errors.New("pmem: MAP_SYNC refused")
	// ErrLocked: another Log (in this or another process) has the file open.
	ErrLocked = errors.New("pmem: log file is in use by another Log")
	// ErrNotSupported is wrapped where the platform cannot map a region.
	ErrNotSupported = errors.New("pmem: not supported")
)

// FullError is returned by Append when the batch does not fit.
type FullError struct {
	NeedBytes int64 // ring bytes the batch needs, pad included
	FreeBytes int64 // ring bytes free between the tail and the head
}

func (e *FullError) Error() string {
	return fmt.Sprintf("pmem: log full: batch needs %d bytes, %d free; truncate to make room", e.NeedBytes, e.FreeBytes)
}

// Is makes errors.Is(err, ErrFull) true.
func (e *FullError) Is(target error) bool { return target == ErrFull }

// Options configure Open.
type Options struct {
	// Path of the region file. Created and formatted if missing.
	Path string
	// SizeBytes of a new region (RegionBytesMin..RegionBytesMax, a multiple
	// of 4 KiB). For an existing region 0 means "whatever it is"; any other
	// value must equal its size.
	SizeBytes int64
	// Mode of persistence; "" or ModeDetect picks one with DetectMode.
	Mode Mode
	// ClusterID and NodeID are stamped at format and checked on every open.
	ClusterID, NodeID uint64
	// LockWait is how long Open waits for another holder of the file's
	// lock to let go before it returns ErrLocked (0: not at all). A
	// process restarted the moment its predecessor was SIGKILLed finds
	// the lock still held for as long as the kernel takes to close the
	// dead process's files; a second live opener is refused all the same,
	// LockWait later.
	LockWait time.Duration
}

// Recovery reports what Open found.
type Recovery struct {
	// Records is how many records Iterate(0) returns after recovery.
	Records int
	// CutBytes is the span of the record that ended the log (0 if clean).
	CutBytes int64
	// CutReason is one of the Cut* constants, or "" if the log ended
	// cleanly.
	CutReason string
	// Generation is this incarnation's number: every Open increments it.
	Generation uint64
}

// Log is the acceptor log. Its methods are safe for concurrent use; they
// are serialized by one mutex, except that Persist does not hold it while
// the persist barrier runs (an msync may take milliseconds, and a writer
// must be able to Append meanwhile): flushMu serializes the barriers, and
// Close waits for the one in progress.
type Log struct {
	flushMu sync.Mutex // held by Persist across its barrier, and by Close
	mu      sync.Mutex
	r       *region
	ring    []byte // r.mem[headerBytes:]
	n       uint64 // len(ring)
	seed    uint64

	meta      meta // the newest persisted meta copy
	metaIndex int  // which copy holds it

	// Invariant: meta.headPos <= persistedPos <= tailPos <= meta.headPos+n.
	persistedPos uint64
	tailPos      uint64
	closed       bool
}

// Open opens the log at opts.Path, creating and formatting it if it is
// missing, validates its header, recovers the ring (cutting a torn or
// corrupt tail, see recover.go) and persists a new generation.
func Open(opts Options) (*Log, Recovery, error) {
	var rec Recovery
	if opts.Path == "" {
		return nil, rec, errors.New("pmem: opening log: empty path")
	}
	mode := opts.Mode
	if mode == "" || mode == ModeDetect {
		m, err := DetectMode(opts.Path)
		if err != nil {
			return nil, rec, err
		}
		mode = m
	}
	if mode != ModeDAX && mode != ModeMsync && mode != ModeShm {
		return nil, rec, fmt.Errorf("pmem: opening log: unknown mode %q (want dax, msync, shm or detect)", mode)
	}
	f, size, created, err := openFile(opts)
	if err != nil {
		return nil, rec, err
	}
	if err := lockFile(f, opts.LockWait); err != nil {
		f.Close()
		return nil, rec, err
	}
	r, err := mapRegion(f, size, mode)
	if err != nil {
		f.Close()
		if created {
			os.Remove(opts.Path)
		}
		return nil, rec, err
	}
	if created || unformatted(r.mem) {
		if err := format(r, opts.ClusterID, opts.NodeID); err != nil {
			r.close()
			return nil, rec, err
		}
	}
	st, err := recoverRegion(r.mem, opts.ClusterID, opts.NodeID, nil)
	if err != nil {
		r.close()
		return nil, rec, fmt.Errorf("opening %s: %w", opts.Path, err)
	}
	l := &Log{
		r: r, ring: r.mem[headerBytes:], n: uint64(len(r.mem) - headerBytes), seed: st.id.seed,
		meta: st.meta, metaIndex: st.metaIndex,
		persistedPos: st.scan.tailPos, tailPos: st.scan.tailPos,
	}
	// What recovery read may sit only in the page cache: the previous
	// incarnation may have crashed between writing and persisting a record
	// or a meta copy. Persist it all now. A later power loss must not tear
	// a recovered record (records persisted after it would be cut), nor the
	// meta copy recovery did not choose while the other one is rewritten
	// (both would then fail). The end marker replaces a cut tail, so the
	// cut is reported once.
	if err := r.persist(0, headerBytes); err != nil {
		r.close()
		return nil, rec, err
	}
	if err := l.persistRange(st.meta.headPos, l.markEnd()); err != nil {
		r.close()
		return nil, rec, err
	}
	m := l.meta
	m.generation++
	if err := l.writeMeta(m); err != nil {
		r.close()
		return nil, rec, err
	}
	l.checkInvariants()
	rec = Recovery{Records: st.scan.live, CutBytes: st.scan.cutBytes, CutReason: st.scan.cutReason, Generation: m.generation}
	return l, rec, nil
}

func checkRegionSize(size int64) error {
	if size < RegionBytesMin || size > RegionBytesMax || size%RegionAlignBytes != 0 {
		return fmt.Errorf("%w: %d bytes (want %d..%d, a multiple of %d)",
			ErrRegionSize, size, RegionBytesMin, int64(RegionBytesMax), RegionAlignBytes)
	}
	return nil
}

// openFile opens or creates the region file and returns its size.
func openFile(opts Options) (f *os.File, size int64, created bool, err error) {
	f, err = os.OpenFile(opts.Path, os.O_RDWR, 0)
	if err == nil {
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, false, fmt.Errorf("pmem: opening log: %w", err)
		}
		size = fi.Size()
		if size == 0 && opts.SizeBytes != 0 {
			// A crash between creating the file and sizing it: size it now;
			// the blank header gets formatted.
			if err := checkRegionSize(opts.SizeBytes); err != nil {
				f.Close()
				return nil, 0, false, fmt.Errorf("creating %s: %w", opts.Path, err)
			}
			if err := f.Truncate(opts.SizeBytes); err == nil {
				err = f.Sync()
			}
			if err != nil {
				f.Close()
				return nil, 0, false, fmt.Errorf("pmem: sizing log: %w", err)
			}
			return f, opts.SizeBytes, false, nil
		}
		if opts.SizeBytes != 0 && opts.SizeBytes != size {
			f.Close()
			return nil, 0, false, fmt.Errorf("%w: %s has %d bytes, options ask for %d", ErrRegionSize, opts.Path, size, opts.SizeBytes)
		}
		if err := checkRegionSize(size); err != nil {
			f.Close()
			return nil, 0, false, fmt.Errorf("opening %s: %w", opts.Path, err)
		}
		return f, size, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) || opts.SizeBytes == 0 {
		// No size given: open an existing region only (a missing one
		// is os.ErrNotExist, not a bad size).
		return nil, 0, false, fmt.Errorf("pmem: opening log: %w", err)
	}
	if err := checkRegionSize(opts.SizeBytes); err != nil {
		return nil, 0, false, fmt.Errorf("creating %s: %w", opts.Path, err)
	}
	f, err = os.OpenFile(opts.Path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, 0, false, fmt.Errorf("pmem: creating log: %w", err)
	}
	// The size and the directory entry must be durable before anything in
	// the file is: msync does not persist file metadata.
	if err := f.Truncate(opts.SizeBytes); err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = syncDir(filepath.Dir(opts.Path))
	}
	if err != nil {
		f.Close()
		os.Remove(opts.Path)
		return nil, 0, false, fmt.Errorf("pmem: creating log: %w", err)
	}
	return f, opts.SizeBytes, true, nil
}

// persistHook, when set (by tests only), runs at the start of every
// persist of a region: the power-loss test uses it to keep a copy of what
// is durable and to crash in the middle of an operation.
var persistHook func(r *region, off, n int64)

// formatSeed draws the checksum seed of a new region. Random, so that a
// payload crafted to look like a record cannot pass for one, and records
// of another region never validate here. Tests replace it to build
// reproducible regions.
var formatSeed = func() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// format writes a fresh header and persists it with the magic zeroed, then
// stores and persists the magic: a crash during format leaves a zero magic,
// and the next Open formats again.
func format(r *region, clusterID, nodeID uint64) error {
	seed, err := formatSeed()
	if err != nil {
		return fmt.Errorf("pmem: formatting: %w", err)
	}
	clear(r.mem[:headerBytes])
	encodeMeta(r.mem[metaOffset0:], seed, meta{seq: 1})
	encodeIdentity(r.mem[identityOffset:], identity{
		version: FormatVersion, clusterID: clusterID, nodeID: nodeID,
		regionBytes: uint64(len(r.mem)), seed: seed,
	})
	magic := binary.LittleEndian.Uint64(r.mem[identityOffset:])
	clear(r.mem[identityOffset : identityOffset+8])
	if err := r.persist(0, headerBytes); err != nil {
		return err
	}
	binary.LittleEndian.PutUint64(r.mem[identityOffset:], magic) // one aligned 8-byte store
	return r.persist(identityOffset, lineBytes)
}

// checkInvariants panics with the state if the positions are inconsistent:
// a broken invariant here means the log could overwrite live records.
func (l *Log) checkInvariants() {
	m := l.meta
	if m.headPos > l.persistedPos || l.persistedPos > l.tailPos || l.tailPos-m.headPos > l.n ||
		m.headPos%recordAlignBytes != 0 || l.tailPos%recordAlignBytes != 0 {
		panic(fmt.Sprintf("pmem: invariant broken: head %d persisted %d tail %d ring %d",
			m.headPos, l.persistedPos, l.tailPos, l.n))
	}
}

// writeMeta persists m into the copy not holding the newest state.
func (l *Log) writeMeta(m meta) error {
	m.seq = l.meta.seq + 1
	idx := 1 - l.metaIndex
	off := int64(metaOffset0)
	if idx == 1 {
		off = metaOffset1
	}
	encodeMeta(l.r.mem[off:], l.seed, m)
	if err := l.r.persist(off, lineBytes); err != nil {
		return err
	}
	l.meta, l.metaIndex = m, idx
	return nil
}

// persistRange persists ring positions [from, to), in at most two pieces
// when it wraps.
func (l *Log) persistRange(from, to uint64) error {
	if from == to {
		return l.r.persist(headerBytes, 0)
	}
	for from < to {
		o := from % l.n
		chunk := min(to-from, l.n-o)
		if err := l.r.persist(int64(headerBytes+o), int64(chunk)); err != nil {
			return err
		}
		from += chunk
	}
	return nil
}

// Mode is the persist mode the log was opened with.
func (l *Log) Mode() Mode { return l.r.mode }

// Promised is the durable promised ballot.
func (l *Log) Promised() Ballot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.meta.promised
}

// SetPromised durably records b as the promised ballot before returning.
// The update is atomic: after a crash Promised is either the old or the
// new ballot, never a mix. The log does not compare ballots; the acceptor
// does.
func (l *Log) SetPromised(b Ballot) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	m := l.meta
	m.promised = b
	return l.writeMeta(m)
}

// NoteChosen records, durably before it returns, the caller's statement
// that every record of a slot at or below slot holds a chosen value (a
// consensus fact the log does not check), so that a restart can commit
// them instead of asking for them again. It only rises: a slot at or
// below the one noted is a no-op.
func (l *Log) NoteChosen(slot uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if slot <= l.meta.chosen {
		return nil
	}
	m := l.meta
	m.chosen = slot
	return l.writeMeta(m)
}

// Chosen is the durable slot NoteChosen recorded (0: none).
func (l *Log) Chosen() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.meta.chosen
}

// Append copies recs into the log after the tail. They are NOT durable
// until Persist returns. The whole batch is appended or, on error, none of
// it: a batch that does not fit before the head returns a *FullError
// (errors.Is(err, ErrFull)); the log never overwrites a record that
// TruncateBelow has not released. A record whose Slot is below the
// truncation point is stored but never returned by Iterate.
func (l *Log) Append(recs []Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if len(recs) > AppendBatchRecordsMax {
		return fmt.Errorf("%w: %d records, at most %d", ErrBatchTooLarge, len(recs), AppendBatchRecordsMax)
	}
	pos := l.tailPos
	for i, r := range recs {
		if r.Type == 0 || r.Type == RecordPad || r.Type > recordTypeMax {
			return fmt.Errorf("%w: record %d has type %d", ErrRecordType, i, r.Type)
		}
		size := uint64(recordBytes(len(r.Payload)))
		if len(r.Payload) > RecordPayloadBytesMax || size > l.n/2 {
			return fmt.Errorf("%w: record %d takes %d bytes, at most %d (RecordBytesMax) and half the %d-byte ring",
				ErrRecordTooLarge, i, recordBytes(len(r.Payload)), RecordBytesMax, l.n)
		}
		if o := pos % l.n; o+size > l.n {
			pos += l.n - o
		}
		pos += size
	}
	need := pos - l.tailPos
	free := l.n - (l.tailPos - l.meta.headPos)
	if need > free {
		return &FullError{NeedBytes: int64(need), FreeBytes: int64(free)}
	}
	gen := l.meta.generation
	for _, r := range recs {
		size := uint64(recordBytes(len(r.Payload)))
		o := l.tailPos % l.n
		if o+size > l.n {
			putRecord(l.ring[o:], l.seed, recordHeader{typ: RecordPad, pos: l.tailPos, generation: gen}, nil)
			l.tailPos += l.n - o
			o = 0
		}
		putRecord(l.ring[o:o+size], l.seed, recordHeader{
			typ: r.Type, slot: r.Slot, ballot: r.Ballot, pos: l.tailPos, generation: gen,
		}, r.Payload)
		l.tailPos += size
	}
	l.checkInvariants()
	l.markEnd()
	return nil
}

// markEnd zeroes the line at the tail, unless the ring is full, so that
// recovery finds a clean end there (decision table row 2) rather than the
// stale bytes of an earlier lap, which it could not tell from a torn
// record. It returns the position up to which a persist must reach.
func (l *Log) markEnd() uint64 {
	if l.tailPos-l.meta.headPos >= l.n {
		return l.tailPos
	}
	o := l.tailPos % l.n
	clear(l.ring[o : o+lineBytes])
	return l.tailPos + lineBytes
}

// persistEnd is the position after the tail's end marker (or the tail
// when the ring is full and there is none).
func (l *Log) persistEnd() uint64 {
	if l.tailPos-l.meta.headPos >= l.n {
		return l.tailPos
	}
	return l.tailPos + lineBytes
}

// Persist makes every record appended before it was called durable (one
// msync, or one flush of the dirty lines plus one fence). Appends may run
// while it flushes: the flushed range ends at the end marker that was the
// tail's when Persist began, and an Append writes only at or beyond that
// tail, so the most a concurrent Append changes in the range is the end
// marker's line, which it overwrites with the start of its own record. A
// crash then finds there either the marker, that record whole (durable
// early, which is harmless: nobody was told it is durable) or a torn record
// that recovery cuts (recover.go); every record before it is durable either
// way. Concurrent Persists take turns.
func (l *Log) Persist() error {
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	if l.persistedPos == l.tailPos {
		l.mu.Unlock()
		return nil // nothing appended; the end marker was persisted already
	}
	from, to, tail := l.persistedPos, l.persistEnd(), l.tailPos
	l.mu.Unlock()
	// The region stays mapped: Close takes flushMu first. The head cannot
	// pass from meanwhile either: TruncateBelow moves it only over records
	// below persistedPos.
	err := l.persistRange(from, to)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		return err
	}
	l.persistedPos = max(l.persistedPos, tail)
	l.checkInvariants()
	return nil
}

// Iterate calls fn for every record with Slot >= fromSlot (and at or above
// the truncation point) in append order, including records appended but
// not yet persisted. Payload aliases the region and is valid only during
// fn. An error from fn stops the walk and is returned. fn must not call
// methods of l (the log's mutex is held).
func (l *Log) Iterate(fromSlot uint64, fn func(Record) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	fromSlot = max(fromSlot, l.meta.truncatedBelow)
	for p := l.meta.headPos; p < l.tailPos; {
		o := p % l.n
		h := getRecordHeader(l.ring[o:])
		if h.typ == RecordPad {
			p += l.n - o
			continue
		}
		p += uint64(recordBytes(int(h.length)))
		if h.slot < fromSlot {
			continue
		}
		payload := l.ring[o+recordHeaderBytes : o+recordHeaderBytes+uint64(h.length)]
		if err := fn(Record{Type: h.typ, Slot: h.slot, Ballot: h.ballot, Payload: payload}); err != nil {
			return err
		}
	}
	return nil
}

// TruncateBelow declares records with Slot < slot dead: Iterate never
// returns them again, and the head advances over the leading persisted
// records whose Slot < slot (stopping at the first live one, since slots
// are not monotonic in the log). Durable when it returns. A slot at or
// below the current truncation point is a no-op.
func (l *Log) TruncateBelow(slot uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if slot <= l.meta.truncatedBelow {
		return nil
	}
	m := l.meta
	m.truncatedBelow = slot
	p := m.headPos
	for p < l.persistedPos {
		o := p % l.n
		h := getRecordHeader(l.ring[o:])
		if h.typ == RecordPad {
			p += l.n - o
			continue
		}
		if h.slot >= slot {
			break
		}
		p += uint64(recordBytes(int(h.length)))
	}
	m.headPos = p
	if err := l.writeMeta(m); err != nil {
		return err
	}
	l.checkInvariants()
	return nil
}

// TruncatedBelow is the durable truncation point.
func (l *Log) TruncatedBelow() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.meta.truncatedBelow
}

// Generation is this incarnation's generation.
func (l *Log) Generation() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.meta.generation
}

// Space reports the ring's size and the bytes between head and tail.
func (l *Log) Space() (usedBytes, ringBytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(l.tailPos - l.meta.headPos), int64(l.n)
}

// Close persists what was appended and unmaps the region.
func (l *Log) Close() error {
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	err := l.persistRange(l.persistedPos, l.persistEnd())
	l.persistedPos = l.tailPos
	l.closed = true
	if cerr := l.r.close(); err == nil {
		err = cerr
	}
	return err
}
