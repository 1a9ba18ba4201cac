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
// changed (one small file, fsynced: ten a second at most): packets
// accepted since the last write can be replayed once after a crash. With
// a record a second old, an outside replay of 3 s of captured datagrams
// right after a crash still had 34 of 156 accepted.
const authFloorsPersistEvery = 100 * time.Millisecond

// loadAuthFloors reads dir's floors record (none: nil). A file that does
// not hold one is an error that names it: it is not guessed past.
func loadAuthFloors(dir string) ([]replica.AuthFloor, error) {
	path := filepath.Join(dir, authFloorsFileName)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(replica.AuthFloorsBytesMax)+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	fs, err := replica.DecodeAuthFloors(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w; remove it to start without it (packets captured before this node's last stop are then accepted once)", path, err)
	}
	return fs, nil
}

// floorsKeeper writes a node's replay floors to data_dir every
// authFloorsPersistEvery while they change, and once more at stop.
type floorsKeeper struct {
	path string
	auth *replica.Auth
	log  zerolog.Logger
	stop chan struct{}
	done sync.WaitGroup
	last []byte
	// warnLog bounds the warnings of a failing write (a full or broken
	// disk would otherwise log ten a second).
	warnLog lograte.Limiter
}

// authFloorsWarnEvery bounds the "recording failed" warnings.
const authFloorsWarnEvery = time.Minute

func startFloorsKeeper(dir string, auth *replica.Auth, log zerolog.Logger) *floorsKeeper {
	k := &floorsKeeper{path: filepath.Join(dir, authFloorsFileName), auth: auth, log: log, stop: make(chan struct{}),
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
	b := replica.EncodeAuthFloors(k.auth.Floors())
	if bytes.Equal(b, k.last) {
		return
	}
	if err := writeFileSynced(k.path, b); err != nil {
		if ok, held := k.warnLog.Allow(time.Now()); ok {
			k.log.Warn().Err(err).Uint64("failures_left_out", held).Str("path", k.path).Msg("recording the consensus replay floors failed: a restart may accept packets captured before it")
		}
		return
	}
	k.last = b
}

// Stop ends the periodic writes and records the floors a last time.
func (k *floorsKeeper) Stop() {
	close(k.stop)
	k.done.Wait()
	k.write()
}
