package sm

import (
	"fmt"

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
