package sm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// Staged restores. A replica catching up by snapshot receives the stream in
// chunks over the network, possibly for a long time, while its state
// machine goes on serving reads and applying; only when the stream is whole
// and verified does it swap the new state in. So a restore is split in
// two:
//
//  1. staging (BeginStage, Stager.Write per chunk, Stager.Finish): the
//     stream is parsed as it arrives and written into a fresh Pebble in
//     the sibling directory dir + ".restore" (never into the live one),
//     as sstables it ingests one after the other (snapshot_ingest.go),
//     holding at most the parser's buffer and one table's writer; Finish
//     checks the end record (count, checksum), that nothing trails it and
//     the stored applied slot, flushes and closes the staged Pebble, and
//     marks it complete with a durable RESTORE-COMPLETE file naming its
//     slot (written to a temporary name, fsynced, renamed, the directory
//     fsynced: the marker is whole or absent). A delta staging
//     (BeginDeltaStage, snapshot_delta.go) starts the directory as a
//     checkpoint of the live state instead of empty, and its stream
//     replaces only the ranges that differ;
//  2. the swap (InstallStaged): rename dir -> dir.old, dir.restore -> dir,
//     fsync the parent, remove the marker and the old state.
//
// Staging takes none of the SM's locks: Apply, Flush, Snapshot and reads go
// on meanwhile. At most one staging exists at a time.
//
// Crash safety. A crash during staging leaves dir.restore without a
// marker, which Open removes (the transfer is asked for again). A crash
// after the marker is durable leaves a complete staged copy: Open swaps it
// in when its slot is above the live state's applied slot (it was staged
// to be installed; the replica stages a snapshot only above its applied
// slot and installs it only when paxos agrees, but a crash may come in
// between, and installing verified chosen state ahead is always safe), and
// removes it otherwise (the node moved past it meanwhile: swapping it in
// would roll the state back below what the acceptor log may have been
// truncated to). A crash during the swap is finished by Open. No point
// leaves a directory that refuses to open.

// ErrStaging is returned by BeginStage while another staging is open.
var ErrStaging = errors.New("sm: a snapshot is already being staged")

// errStageAborted ends a staging's parser when the staging is abandoned.
var errStageAborted = errors.New("sm: staging aborted")

// Stager writes one snapshot stream into the staging directory as it
// arrives. Its methods are for one goroutine; Close and Abandon of the SM
// abort it.
type Stager struct {
	s    *SM
	dir  string
	db   *pebble.DB
	pw   *io.PipeWriter
	done chan struct{} // closed when the parser returned
	slot uint64        // the parser's result (valid after done)
	err  error         // the parser's error (valid after done)

	// A delta staging's digest (closed digestC: digest or digestErr set),
	// its ranges and how many the stream kept (valid after done).
	digestC      chan struct{}
	digest       []byte
	digestErr    error
	ranges, kept int
	aborting     atomic.Bool // the digest's computation gives up

	mu       sync.Mutex
	finished bool // Finish, Abort or an abort by the SM ran
	written  int64
}

// BeginStage clears the staging directory, opens a fresh Pebble in it and
// returns the Stager that fills it from a whole snapshot stream.
// ErrStaging while another staging is open; ErrClosed after Close.
func (s *SM) BeginStage() (*Stager, error) {
	return s.beginStage(false)
}

// BeginDeltaStage is BeginStage for a delta stream (snapshot_delta.go):
// the staging directory starts as a checkpoint of the live state (hard
// links), whose digest the Stager computes meanwhile (Digest).
func (s *SM) BeginDeltaStage() (*Stager, error) {
	return s.beginStage(true)
}

func (s *SM) beginStage(delta bool) (*Stager, error) {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	if s.stager != nil {
		return nil, ErrStaging
	}
	// Closed (or abandoned, as a crash): the staging directory is left as
	// it is, a complete staged copy included, for the next Open.
	closed := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closed || (delta && s.dbClosed)
	}
	if closed() {
		return nil, ErrClosed
	}
	dir := s.dir + restoreDirSuffix
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("sm: staging: clearing %s: %w", dir, err)
	}
	var err error
	if delta {
		s.mu.Lock()
		if s.closed || s.dbClosed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		// Under mu: no swap closes the live Pebble meanwhile. O(files).
		// The live Pebble runs without a WAL, so the checkpoint holds
		// the state as of its last flush (the applied slot with it):
		// consistent, and behind by at most what the memtables hold,
		// which the server then sends. No flush here: at a restart the
		// memtables hold the log's replay, and flushing it would delay
		// the digest for nothing the delta does not already cover.
		err = s.db.Checkpoint(dir)
		s.mu.Unlock()
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("sm: staging: checkpoint into %s: %w", dir, err)
	}
	po := s.pebbleOptions()
	db, err := pebble.Open(dir, po)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("sm: staging: opening %s: %w", dir, err)
	}
	pr, pw := io.Pipe()
	st := &Stager{s: s, dir: dir, db: db, pw: pw, done: make(chan struct{}), digestC: make(chan struct{})}
	go func() {
		defer close(st.done)
		if delta {
			rs, err := computeDigest(db, st.aborting.Load)
			if err == nil {
				st.digest, st.ranges = encodeDigest(rs), len(rs)
			}
			st.digestErr = err
			close(st.digestC)
			if err == nil {
				st.slot, st.kept, st.err = readDelta(db, po, dir, pr, rs)
			} else {
				st.err = err
			}
		} else {
			close(st.digestC)
			st.slot, st.err = readSnapshot(db, po, dir, pr)
		}
		// Writes after the parser returned (a bad stream, or bytes past
		// its end) fail instead of blocking.
		if st.err != nil {
			pr.CloseWithError(st.err)
		} else {
			pr.CloseWithError(fmt.Errorf("%w: trailing bytes after the end record", ErrBadSnapshot))
		}
	}()
	s.stager = st
	return st, nil
}

// Digest waits for a delta staging's digest: its copy's ranges and hashes,
// for the fetcher's request (SnapshotDelta on the server). A whole
// staging has none (nil, nil).
func (st *Stager) Digest() ([]byte, error) {
	<-st.digestC
	return st.digest, st.digestErr
}

// DigestReady is closed once Digest would not block.
func (st *Stager) DigestReady() <-chan struct{} {
	return st.digestC
}

// DeltaRanges reports, after a delta staging's Finish, how many of its
// digest's ranges the server kept and how many there were (0, 0 for a
// whole staging).
func (st *Stager) DeltaRanges() (kept, ranges int) {
	return st.kept, st.ranges
}

// Write parses and stores the next bytes of the stream; it returns once
// they are consumed. A malformed stream is an error wrapping
// ErrBadSnapshot (the staging is then useless: Abort it).
func (st *Stager) Write(p []byte) (int, error) {
	n, err := st.pw.Write(p)
	st.mu.Lock()
	st.written += int64(n)
	st.mu.Unlock()
	if err != nil {
		if errors.Is(err, io.ErrClosedPipe) {
			err = errStageAborted
		}
		return n, err
	}
	return n, nil
}

// Written is how many stream bytes Write consumed.
func (st *Stager) Written() int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.written
}

// Finish ends the stream and completes the staged copy: verified, flushed,
// closed and marked complete durably with its slot, which it returns. On
// error the staging is removed.
func (st *Stager) Finish() (uint64, error) {
	st.mu.Lock()
	if st.finished {
		st.mu.Unlock()
		return 0, errStageAborted
	}
	st.finished = true
	st.mu.Unlock()
	st.pw.Close()
	<-st.done
	err := st.err
	if err == nil {
		err = checkApplied(st.db, st.slot)
	}
	if err == nil {
		// The copy is the state after st.slot, taken from a snapshot:
		// Installed's contract.
		if serr := st.db.Set(installedKey, binary.BigEndian.AppendUint64(nil, st.slot), pebble.NoSync); serr != nil {
			err = fmt.Errorf("sm: staging: recording the installed slot: %w", serr)
		}
	}
	if err == nil {
		if ferr := st.db.Flush(); ferr != nil {
			err = fmt.Errorf("sm: staging: flushing: %w", ferr)
		}
	}
	if cerr := st.db.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("sm: staging: closing %s: %w", st.dir, cerr)
	}
	if err == nil {
		err = writeDoneFile(st.dir, st.slot)
	}
	if err != nil {
		os.RemoveAll(st.dir)
	}
	st.release()
	if err != nil {
		return 0, err
	}
	return st.slot, nil
}

// Abort abandons the staging and removes its directory. It is a no-op
// after Finish.
func (st *Stager) Abort() {
	if st.stop() {
		os.RemoveAll(st.dir)
	}
	st.release()
}

// stop ends the parser and closes the staged Pebble, leaving the
// directory as a crash would (incomplete, no marker); it reports whether
// it did anything.
func (st *Stager) stop() bool {
	st.mu.Lock()
	if st.finished {
		st.mu.Unlock()
		return false
	}
	st.finished = true
	st.mu.Unlock()
	st.aborting.Store(true)
	st.pw.CloseWithError(errStageAborted)
	<-st.done
	st.db.Close()
	return true
}

// release lets the SM open the next staging.
func (st *Stager) release() {
	st.s.snapMu.Lock()
	if st.s.stager == st {
		st.s.stager = nil
	}
	st.s.snapMu.Unlock()
}

// abortStaging stops an open staging (Close and Abandon of the SM): its
// directory stays, incomplete, for Open to remove.
func (s *SM) abortStaging() {
	s.snapMu.Lock()
	st := s.stager
	s.snapMu.Unlock()
	if st != nil {
		st.stop()
		st.release()
	}
}

// StagedSlot returns the slot of the complete staged copy, or 0 when
// there is none.
func (s *SM) StagedSlot() uint64 {
	slot, ok := readDoneFile(s.dir + restoreDirSuffix)
	if !ok {
		return 0
	}
	return slot
}

// DiscardStaged removes a staged copy, complete or not (a transfer that
// arrived too late). It refuses while a staging is open.
func (s *SM) DiscardStaged() error {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	if s.stager != nil {
		return ErrStaging
	}
	return os.RemoveAll(s.dir + restoreDirSuffix)
}

// InstallStaged swaps in the complete staged copy, which must be at slot,
// and returns once the new state serves (Applied() == slot). Reads during
// the swap see the old state until the new one is open; open Snapshot
// streams are aborted. If the swap itself fails the SM refuses everything
// until reopened, and Open finishes the swap.
func (s *SM) InstallStaged(slot uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.dbClosed {
		return s.broken
	}
	got, ok := readDoneFile(s.dir + restoreDirSuffix)
	if !ok || got != slot {
		return fmt.Errorf("sm: no complete staged snapshot at slot %d (found %d, complete %v)", slot, got, ok)
	}
	return s.swapLocked(slot)
}

// swapLocked swaps the complete staged copy in (s.mu held).
func (s *SM) swapLocked(slot uint64) error {
	s.abortSnapshots()
	s.stopCompaction()
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if err := s.db.Close(); err != nil {
		s.broken = fmt.Errorf("sm: restore: closing the old state: %w", err)
		return s.broken
	}
	s.dbClosed = true // until the swapped-in state is open
	s.lens.reset()
	s.alens.reset()
	if err := swapRestored(s.dir); err != nil {
		// The directories are as recoverRestore expects: reopening
		// finishes the swap. Until then this SM cannot go on.
		s.broken = fmt.Errorf("sm: restore: swapping in the new state: %w", err)
		return s.broken
	}
	db, err := pebble.Open(s.dir, s.pebbleOptions())
	if err != nil {
		s.broken = fmt.Errorf("sm: restore: reopening: %w", err)
		return s.broken
	}
	s.db, s.dbClosed = db, false
	if err := s.load(); err != nil {
		s.broken = err
		return err
	}
	if got := s.applied.Load(); got != slot {
		s.broken = fmt.Errorf("sm: restore: applied slot %d after the swap, want %d", got, slot)
		return s.broken
	}
	s.broken = nil // a restored state is whole, whatever failed before
	return nil
}

// FlushAsync starts making everything applied so far durable without
// waiting: it returns the applied slot at this moment and a channel closed
// once that slot is durable (the acceptor log may then be truncated up to
// it). It costs a memtable rotation, not a flush.
func (s *SM) FlushAsync() (uint64, <-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, nil, ErrClosed
	}
	if s.dbClosed {
		return 0, nil, s.broken
	}
	slot := s.applied.Load()
	done, err := s.db.AsyncFlush()
	if err != nil {
		return 0, nil, fmt.Errorf("sm: flushing: %w", err)
	}
	return slot, done, nil
}

// The complete-marker of a staged copy holds its slot (u64 big endian).
// Markers written before staged restores existed are empty: such a copy
// is swapped in unconditionally, as it was then.
const doneFileTmpSuffix = ".tmp"

// writeDoneFile marks the staging directory complete at slot, durably and
// atomically (a torn marker is never read).
func writeDoneFile(dir string, slot uint64) error {
	path := filepath.Join(dir, restoreDoneFile)
	tmp := path + doneFileTmpSuffix
	err := func() error {
		f, err := os.Create(tmp)
		if err != nil {
			return err
		}
		_, err = f.Write(binary.BigEndian.AppendUint64(nil, slot))
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp, path)
		}
		if err == nil {
			err = syncDir(dir)
		}
		return err
	}()
	if err != nil {
		return fmt.Errorf("sm: restore: marking complete: %w", err)
	}
	return nil
}

// readDoneFile reads the marker of a staging directory: its slot (0 for a
// marker of an older version) and whether the directory is complete.
func readDoneFile(dir string) (uint64, bool) {
	b, err := os.ReadFile(filepath.Join(dir, restoreDoneFile))
	if err != nil {
		return 0, false
	}
	if len(b) == 8 {
		return binary.BigEndian.Uint64(b), true
	}
	return 0, len(b) == 0
}

// appliedOf reads the applied slot of the Pebble in dir, opened read-only.
func appliedOf(dir string) (uint64, error) {
	db, err := pebble.Open(dir, &pebble.Options{ReadOnly: true, Logger: quietLogger{}})
	if err != nil {
		return 0, err
	}
	defer db.Close()
	v, closer, err := db.Get(appliedKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, fmt.Errorf("sm: applied key holds %d bytes, want 8", len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// quietLogger discards Pebble's messages (a read-only peek at startup).
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
