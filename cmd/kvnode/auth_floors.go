package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"synod/internal/lograte"
	"synod/kv/replica"
)

// authFloorsFileName is the file in data_dir that records this node's
// replay floors (kv/replica auth_floors.go): per sender and channel, the
// highest counter it accepted, so a restart refuses packets captured
// before it.
const authFloorsFileName = "auth_floors"

// authFloorsPersistEvery is how often the floors are written when they
// changed (in place, into one of the file's two slots, and flushed with
// fdatasync: ten a second at most; kv/replica auth_floors_file.go):
// packets accepted since the last write can be replayed once after a
// crash. With a record a second old, an outside replay of 3 s of captured
// datagrams right after a crash still had 34 of 156 accepted.
const authFloorsPersistEvery = 100 * time.Millisecond

// loadAuthFloors reads dir's floors record (none: nil), of either file
// version, and the file's write number (0: no file, or one of version 1),
// which startFloorsKeeper continues. A file that does not hold one is an
// error that names it: it is not guessed past.
func loadAuthFloors(dir string) ([]replica.AuthFloor, uint64, error) {
	path := filepath.Join(dir, authFloorsFileName)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	// At most one byte more than either version holds: a larger file is
	// refused by the decoder.
	b, err := io.ReadAll(io.LimitReader(f, int64(max(replica.AuthFloorsBytesMax, replica.AuthFloorsFileBytes))+1))
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s: %w", path, err)
	}
	fs, gen, err := replica.DecodeAuthFloorsFile(b)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w; remove it to start without it (packets captured before this node's last stop are then accepted once)", path, err)
	}
	return fs, gen, nil
}

// floorsKeeper writes a node's replay floors to data_dir every
// authFloorsPersistEvery while they change, and once more at stop. It
// keeps the file open and writes each record in place, into the slot its
// write number names (replica.AuthFloorsSlotOffset), then fdatasyncs: no
// rename, no new blocks, so no journal commit ten times a second. A file
// of the version before, or none, is first replaced whole (written to a
// temporary file, fsynced and renamed, as before).
type floorsKeeper struct {
	path string
	auth *replica.Auth
	log  zerolog.Logger
	stop chan struct{}
	done sync.WaitGroup
	last []byte
	// f is the open version 2 file (nil until opened: a failed open is
	// tried again at the next write), gen the number of its last write
	// (0: there is no version 2 file yet).
	f   *os.File
	gen uint64
	// warnLog bounds the warnings of a failing write (a full or broken
	// disk would otherwise log ten a second).
	warnLog lograte.Limiter
}

// authFloorsWarnEvery bounds the "recording failed" warnings.
const authFloorsWarnEvery = time.Minute

// startFloorsKeeper starts the keeper of dir's floors file, whose last
// write number loadAuthFloors returned as gen.
func startFloorsKeeper(dir string, auth *replica.Auth, gen uint64, log zerolog.Logger) *floorsKeeper {
	k := &floorsKeeper{path: filepath.Join(dir, authFloorsFileName), auth: auth, gen: gen, log: log, stop: make(chan struct{}),
		warnLog: lograte.Limiter{Every: authFloorsWarnEvery}}
	k.done.Add(1)
	go func() {
		defer k.done.Done()
		t := time.NewTicker(authFloorsPersistEvery)
		defer t.Stop()
		for {
			select {
			case <-k.stop:
				return
			case <-t.C:
				k.write()
			}
		}
	}()
	return k
}

// write records the floors if they changed since the last write.
func (k *floorsKeeper) write() {
	fs := k.auth.Floors()
	b := replica.EncodeAuthFloors(fs)
	if bytes.Equal(b, k.last) {
		return
	}
	if err := k.record(fs); err != nil {
		if ok, held := k.warnLog.Allow(time.Now()); ok {
			k.log.Warn().Err(err).Uint64("failures_left_out", held).Str("path", k.path).Msg("recording the consensus replay floors failed: a restart may accept packets captured before it")
		}
		return
	}
	k.last = b
}

// record writes fs as the next write number: in place once the file is
// open, else by replacing the file whole. A failed write leaves the write
// number where it was, so the retry goes to the same slot and the other
// keeps the last good record.
func (k *floorsKeeper) record(fs []replica.AuthFloor) error {
	if k.f == nil {
		return k.open(fs)
	}
	gen := k.gen + 1
	if _, err := k.f.WriteAt(replica.EncodeAuthFloorsSlot(gen, fs), replica.AuthFloorsSlotOffset(gen)); err != nil {
		return err
	}
	if err := fdatasync(k.f); err != nil {
		return err
	}
	k.gen = gen
	return nil
}

// open opens the version 2 file for writes in place and writes fs as its
// next write; with none yet (no file, or one of version 1), it first
// replaces the file whole by one holding fs (which already includes
// whatever the node loaded from it at start).
func (k *floorsKeeper) open(fs []replica.AuthFloor) error {
	fresh := k.gen == 0
	if fresh {
		if err := writeFileSynced(k.path, replica.AuthFloorsFileImage(1, fs)); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(k.path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	k.f = f
	if fresh {
		k.gen = 1 // fs is recorded
		return nil
	}
	return k.record(fs)
}

// Stop ends the periodic writes, records the floors a last time and
// closes the file.
func (k *floorsKeeper) Stop() {
	close(k.stop)
	k.done.Wait()
	k.write()
	if k.f != nil {
		k.f.Close()
	}
}
