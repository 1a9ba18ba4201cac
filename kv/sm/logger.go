package sm

import (
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/rs/zerolog"

	"synod/internal/lograte"
)

// pebbleErrorLogEvery bounds Pebble's error lines: on a full disk Pebble
// retries its flush continuously and logged each failure (13,394 lines in
// 90 s, seen by an outside tester); one line per interval says the same,
// with the count of the lines left out.
const pebbleErrorLogEvery = time.Second

// diskFullRetryPause is how long a write that met ENOSPC waits before its
// one retry (vfs.OnDiskFull; new writes wait too). Pebble retries a failed
// flush at once, without a back-off (cockroachdb/pebble#6139, open; the
// fix, #6166, not released): on a full disk it tried about 1,600 flushes a
// second and took 1.1 of the VM's two cores (an outside tester). The pause
// makes that about ten a second, and gives a MANIFEST write that met a full
// disk one more chance after the space a compaction or a delete freed
// meanwhile.
const diskFullRetryPause = 100 * time.Millisecond

func diskFullPause() { time.Sleep(diskFullRetryPause) }

// newPebbleLimiter lets one error line through per pebbleErrorLogEvery
// and counts the rest; shared by the logger and the event listener of one
// store.
func newPebbleLimiter() *lograte.Limiter { return &lograte.Limiter{Every: pebbleErrorLogEvery} }

// pebbleLogger routes Pebble's log lines to zerolog: Info at debug level
// (Pebble is chatty at start), errors at error level (at most one per
// pebbleErrorLogEvery). Fatalf logs and panics, as Pebble's contract
// requires it not to return.
type pebbleLogger struct {
	log     zerolog.Logger
	limiter *lograte.Limiter
}

func (l pebbleLogger) Infof(format string, args ...any) {
	l.log.Debug().Msgf("pebble: "+format, args...)
}

func (l pebbleLogger) Errorf(format string, args ...any) {
	if ok, n := l.limiter.Allow(time.Now()); ok {
		l.log.Error().Uint64("lines_left_out", n).Msgf("pebble: "+format, args...)
	}
}

func (l pebbleLogger) Fatalf(format string, args ...any) {
	l.log.Error().Msgf("pebble: fatal: "+format, args...)
	panic(fmt.Sprintf("pebble: fatal: "+format, args...))
}

// pebbleEvents logs what an operator must hear of: a background error (a
// flush or compaction that failed: a full disk is the common cause, and
// then every write stalls until space is freed, since Pebble retries) at
// error level, at most one line per pebbleErrorLogEvery (with limiter,
// shared with the logger), and write stalls (memtables or L0 full:
// applies wait) at warn level, with their end.
func pebbleEvents(log zerolog.Logger, limiter *lograte.Limiter) *pebble.EventListener {
	return &pebble.EventListener{
		BackgroundError: func(err error) {
			if ok, n := limiter.Allow(time.Now()); ok {
				log.Error().Err(err).Uint64("lines_left_out", n).Msg("pebble: a flush or compaction failed; writes stall once the memtables fill, until it succeeds (a full disk: free space under data_dir)")
			}
		},
		WriteStallBegin: func(info pebble.WriteStallBeginInfo) {
			log.Warn().Str("reason", info.Reason).Msg("pebble: write stall: applies wait")
		},
		WriteStallEnd: func() {
			log.Info().Msg("pebble: write stall ended")
		},
	}
}
