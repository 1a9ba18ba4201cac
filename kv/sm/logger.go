package sm

import (
	"fmt"
	"github.com/cockroachdb/pebble/v2"

	"github.com/rs/zerolog"
)

// pebbleLogger routes Pebble's log lines to zerolog: Info at debug level
// (Pebble is chatty at start), errors at error level. Fatalf logs and
// panics, as Pebble's contract requires it not to return.
type pebbleLogger struct{ log zerolog.Logger }

func (l pebbleLogger) Infof(format string, args ...any) {
	l.log.Debug().Msgf("pebble: "+format, args...)
}

func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error().Msgf("pebble: "+format, args...)
}

func (l pebbleLogger) Fatalf(format string, args ...any) {
	l.log.Error().Msgf("pebble: fatal: "+format, args...)
	panic(fmt.Sprintf("pebble: fatal: "+format, args...))
}

// pebbleEvents logs what an operator must hear of: a background error (a
// flush or compaction that failed: a full disk is the common cause, and
// then every write stalls until space is freed, since Pebble retries) at
// error level, and write stalls (memtables or L0 full: applies wait) at
// warn level, with their end.
func pebbleEvents(log zerolog.Logger) *pebble.EventListener {
	return &pebble.EventListener{
		BackgroundError: func(err error) {
			log.Error().Err(err).Msg("pebble: a flush or compaction failed; writes stall once the memtables fill, until it succeeds (a full disk: free space under data_dir)")
		},
		WriteStallBegin: func(info pebble.WriteStallBeginInfo) {
			log.Warn().Str("reason", info.Reason).Msg("pebble: write stall: applies wait")
		},
		WriteStallEnd: func() {
			log.Info().Msg("pebble: write stall ended")
		},
	}
}
