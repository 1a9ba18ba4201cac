package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// TestLogTimeInMilliseconds: a log line's "time" carries milliseconds
// (logTimeFormat), and parses back within a millisecond of when it was
// written.
func TestLogTimeInMilliseconds(t *testing.T) {
	var buf bytes.Buffer
	log := newLoggerTo(&buf, &Config{LogLevel: "info", NodeID: 7})
	before := time.Now()
	log.Info().Msg("hello")
	var line struct {
		Time string `json:"time"`
		Node uint64 `json:"node"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("%v: %q", err, buf.String())
	}
	at, err := time.Parse(logTimeFormat, line.Time)
	if err != nil {
		t.Fatalf("time %q: %v", line.Time, err)
	}
	if len(line.Time) != len("2006-01-02T15:04:05.000Z") && len(line.Time) != len(logTimeFormat) {
		t.Fatalf("time %q does not have three fractional digits", line.Time)
	}
	if d := at.Sub(before.Truncate(time.Millisecond)); d < 0 || d > time.Second {
		t.Fatalf("time %v, written at %v", at, before)
	}
	if line.Node != 7 {
		t.Fatalf("node %d", line.Node)
	}
}
