package main

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"synod/internal/stall"
)

// StallConfig is the [stall] table: the stall detector (internal/stall).
// A stage of a request's path (kv/replica/stages.go) that takes longer
// than threshold is counted in synod_stage_stalls_total{path,stage} and
// logged with its slot; with trace on, the last trace_window of Go
// execution trace is written to a file in trace_dir, named in the log
// line (at most one per trace_every; at most trace_files_max files and
// trace_bytes_max bytes, the oldest removed first). Read a file with
// `go tool trace FILE` or summarize its stalls with `kvbench stalls FILE`.
type StallConfig struct {
	// Threshold is a Go duration (default "20ms"), or "off": no stall is
	// counted, logged or traced.
	Threshold string `toml:"threshold"`
	// Trace runs the runtime/trace flight recorder (default off: it costs
	// every node CPU and the tail; see docs/benchmarking.md, "What the
	// flight recorder costs the tail").
	Trace *bool `toml:"trace"`
	// TraceDir receives the trace files (default <data_dir>/stalls).
	TraceDir      string `toml:"trace_dir"`
	TraceFilesMax int    `toml:"trace_files_max"`
	TraceBytesMax int64  `toml:"trace_bytes_max"`
	TraceEvery    string `toml:"trace_every"`
	TraceWindow   string `toml:"trace_window"`

	// cfg is the detector's configuration, set by validateStall (off:
	// Threshold is "off").
	cfg stall.Config
	off bool
}

// stallTraceDefault: the flight recorder runs only with trace = true.
// Recording every goroutine switch took 3.5-6.4 % of each node's CPU at
// 13,000 writes a second on the 2-core VM and raised the write P99 in
// most alternated runs (docs/benchmarking.md, "What the flight recorder
// costs the tail"), so it is a diagnosis an operator turns on, not a
// cost every node pays; stalls are counted and logged with their stage
// and slot either way.
const stallTraceDefault = false

// validateStall checks [stall] and resolves it into a stall.Config.
func (c *Config) validateStall() error {
	s := &c.Stall
	if s.Threshold == "off" {
		s.off = true
		return nil
	}
	cfg := stall.Config{Recorder: stallTraceDefault, Dir: s.TraceDir, FilesMax: s.TraceFilesMax, BytesMax: s.TraceBytesMax}
	if s.Trace != nil {
		cfg.Recorder = *s.Trace
	}
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(c.DataDir, "stalls")
	}
	for _, d := range []struct {
		key string
		s   string
		dst *time.Duration
	}{{"threshold", s.Threshold, &cfg.Threshold}, {"trace_every", s.TraceEvery, &cfg.Every}, {"trace_window", s.TraceWindow, &cfg.Window}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil || v <= 0 {
			return fmt.Errorf("stall.%s: %q is not a positive duration (threshold may also be \"off\")", d.key, d.s)
		}
		*d.dst = v
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("stall.%w", err)
	}
	s.cfg = cfg
	return nil
}

// stallDetector starts the detector [stall] describes (nil when off).
func (c *Config) stallDetector(log zerolog.Logger) (*stall.Detector, error) {
	if c.Stall.off {
		return nil, nil
	}
	d, err := stall.New(c.Stall.cfg, log.With().Str("loop", "stall").Logger())
	if err != nil {
		return nil, fmt.Errorf("stall: %w", err)
	}
	log.Info().Dur("threshold", d.Threshold()).Bool("trace", d.Recording()).Str("trace_dir", c.Stall.cfg.Dir).
		Msg("stall detector")
	return d, nil
}

// stallTraceRoom is the stall detector's room check
// (stall.Detector.SetRoom): a trace file written on data_dir's filesystem
// must leave the disk reserve ([limits] disk_free_min_bytes) free, so that
// traces (up to trace_bytes_max) never take the room the store keeps for
// itself. It returns nil (no check) when the trace directory is on another
// filesystem, which its operator chose, or cannot be compared. space is
// the space guard's reading (kv/space Guard.DiskSpace: reserve 0 when the
// check is off).
func stallTraceRoom(traceDir, dataDir string, space func() (free, reserve int64, low, failed bool)) func(int64) error {
	var a, b unix.Stat_t
	if unix.Stat(traceDir, &a) != nil || unix.Stat(dataDir, &b) != nil || a.Dev != b.Dev {
		return nil
	}
	return func(n int64) error {
		free, reserve, _, failed := space()
		switch {
		case reserve <= 0:
			return nil
		case failed:
			return fmt.Errorf("the free space of data_dir's filesystem could not be read")
		case free-n < reserve:
			return fmt.Errorf("data_dir's filesystem has %d bytes free: a trace of up to %d bytes would take the disk reserve of %d (disk_free_min_bytes)", free, n, reserve)
		}
		return nil
	}
}
