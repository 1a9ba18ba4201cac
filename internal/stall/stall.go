package stall

import (
	"context"
	"errors"
	"fmt"
	"runtime/trace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Defaults and limits of a Config. Every default is what a zero field
// means (WithDefaults).
const (
	// ThresholdDefault: a stage past 20 ms is a stall. A write's whole
	// path takes well under a millisecond when nothing stalls (README,
	// "Single-client latency"); 20 ms is the Raft store's open-loop P99
	// that synod's tail is measured against (docs/benchmarking.md).
	ThresholdDefault = 20 * time.Millisecond
	// ThresholdMin and ThresholdMax bound a configured threshold: below
	// 100 µs ordinary scheduling would count as stalls.
	ThresholdMin = 100 * time.Microsecond
	ThresholdMax = time.Minute
	// WindowDefault is how much execution trace a snapshot holds at least
	// (FlightRecorderConfig.MinAge): longer than the longest stall seen
	// (a few hundred ms) with room before it for the cause.
	WindowDefault = 2 * time.Second
	WindowMin     = 100 * time.Millisecond
	WindowMax     = time.Minute
	// EveryDefault is the least time between two snapshots: each one
	// costs tens of ms of CPU and up to FileBytesMax of disk.
	EveryDefault = 10 * time.Second
	EveryMin     = 100 * time.Millisecond
	// FilesMaxDefault and BytesMaxDefault bound the trace directory.
	FilesMaxDefault = 16
	FilesMax        = 1024
	BytesMaxDefault = 256 << 20
	// FileBytesMin is the least room one snapshot may have
	// (BytesMax/FilesMax): a smaller trace would rarely hold a window.
	FileBytesMin = 1 << 20
	// TraceCategory is the category of the trace.Log event that marks a
	// stall in the execution trace.
	TraceCategory = "synod.stall"
	// logLinesPerSecMax bounds the stall lines logged without a trace
	// file per second (logWindow).
	logLinesPerSecMax = 4
	logWindow         = time.Second
	// marksPerSecMax bounds the stall marks put in the execution trace
	// per second: an overloaded node stalls every request, and a mark
	// per request would fill the recorder's window with marks.
	marksPerSecMax = 256
)

// Config configures a Detector.
type Config struct {
	// Threshold: a stage that takes longer is a stall.
	Threshold time.Duration
	// Recorder runs the FlightRecorder, so stalls come with a trace. It
	// costs CPU while it runs (docs/benchmarking.md measures it).
	Recorder bool
	// Dir receives the trace files ("": stalls are counted and logged,
	// no trace is written). Created if missing.
	Dir string
	// FilesMax and BytesMax bound the trace files in Dir; one file may
	// take at most BytesMax/FilesMax bytes.
	FilesMax int
	BytesMax int64
	// Every is the least time between two snapshots.
	Every time.Duration
	// Window is how much execution trace the recorder keeps at least; the
	// recorder's memory is bounded by half a file's bytes
	// (FileBytesMax/2), which wins over Window when the trace is dense.
	Window time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Threshold == 0 {
		c.Threshold = ThresholdDefault
	}
	if c.FilesMax == 0 {
		c.FilesMax = FilesMaxDefault
	}
	if c.BytesMax == 0 {
		c.BytesMax = BytesMaxDefault
	}
	if c.Every == 0 {
		c.Every = EveryDefault
	}
	if c.Window == 0 {
		c.Window = WindowDefault
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports a configuration outside the limits, after defaults.
// Errors name the fields as kvnode's [stall] keys do.
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.Threshold < ThresholdMin || c.Threshold > ThresholdMax:
		return fmt.Errorf("threshold: %v is outside [%v, %v]", c.Threshold, ThresholdMin, ThresholdMax)
	case c.FilesMax < 1 || c.FilesMax > FilesMax:
		return fmt.Errorf("trace_files_max: %d is outside [1, %d]", c.FilesMax, FilesMax)
	case c.BytesMax/int64(c.FilesMax) < FileBytesMin:
		return fmt.Errorf("trace_bytes_max: %d bytes over %d files leaves less than %d bytes a file", c.BytesMax, c.FilesMax, FileBytesMin)
	case c.Every < EveryMin:
		return fmt.Errorf("trace_every: %v is below %v", c.Every, EveryMin)
	case c.Window < WindowMin || c.Window > WindowMax:
		return fmt.Errorf("trace_window: %v is outside [%v, %v]", c.Window, WindowMin, WindowMax)
	}
	return nil
}

// FileBytesMax is the most one trace file may hold.
func (c Config) FileBytesMax() int64 {
	c = c.WithDefaults()
	return c.BytesMax / int64(c.FilesMax)
}

// Event is one stall.
type Event struct {
	Path  string        // "write" or "read"
	Stage string        // the stage's label (kv/replica's stage names)
	Took  time.Duration // how long the stage took
	Slot  uint64        // the slot (or read index) concerned; 0: none
}

// Detector logs stalls and keeps their traces. Safe for concurrent use.
type Detector struct {
	cfg Config
	log zerolog.Logger
	rec *recorder // nil: no flight recorder

	mu        sync.Mutex
	closed    bool
	writing   bool      // a snapshot is being written
	lastTrace time.Time // when the last snapshot began
	lim       lineLimiter
	marks     lineLimiter    // counts marks, not lines
	wg        sync.WaitGroup // snapshots being written
	lines     sync.WaitGroup // log lines being written

	stalls, written, skipped, failed atomic.Uint64
	noRoom                           atomic.Uint64
	traces                           *prometheus.CounterVec
	skippedC                         prometheus.Counter // traces{result="skipped"}
	// room, when set, is asked before each trace file (SetRoom).
	room atomic.Pointer[func(bytes int64) error]
}

// SetRoom makes the detector ask room before it writes each trace file,
// with the most that file may take (FileBytesMax); an error skips the
// trace (counted as result "no_room", logged with the error). kvnode
// passes its disk reserve check, so traces never take the room the store
// keeps for itself. room runs on the goroutine that writes the trace,
// never on the stalled loop (it may statfs a slow disk). Safe to call
// once, at any time.
func (d *Detector) SetRoom(room func(bytes int64) error) { d.room.Store(&room) }

// ErrClosed is returned by a Detector used after Close.
var ErrClosed = errors.New("stall: detector closed")

// New starts a detector (and the process's flight recorder when
// cfg.Recorder is set).
func New(cfg Config, log zerolog.Logger) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	d := &Detector{cfg: cfg, log: log}
	d.lim.now, d.lim.max = cfg.Now, logLinesPerSecMax
	d.marks.now, d.marks.max = cfg.Now, marksPerSecMax
	d.traces = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "synod_stall_traces_total",
		Help: "Stall traces: written (a file in the trace directory), skipped (rate limit, a write in progress, or no recorder), failed, no_room (the disk reserve would be taken).",
	}, []string{"result"})
	for _, r := range []string{"written", "skipped", "failed", "no_room"} {
		d.traces.WithLabelValues(r)
	}
	d.skippedC = d.traces.WithLabelValues("skipped")
	if cfg.Dir != "" {
		if err := prepareDir(cfg.Dir); err != nil {
			return nil, err
		}
	}
	if cfg.Recorder {
		rec, err := acquireRecorder(cfg.Window, uint64(cfg.FileBytesMax()/2))
		if err != nil {
			return nil, err
		}
		d.rec = rec
	}
	return d, nil
}

// Threshold is the duration past which a stage is a stall.
func (d *Detector) Threshold() time.Duration { return d.cfg.Threshold }

// Recording reports whether the flight recorder runs for this detector.
func (d *Detector) Recording() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rec != nil
}

// SetRecording starts (on) or stops the flight recorder while the
// detector runs, so an operator can take traces of a node that stalls
// without restarting it (kvnode's POST /debug/stall_trace); cfg.Recorder
// is only the state it starts in. A stall after the recorder started has
// at most cfg.Window of trace before it; a snapshot being written when it
// stops is finished first (the recorder's writeMu). It reports whether
// the state changed; ErrClosed after Close.
func (d *Detector) SetRecording(on bool) (changed bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.closed:
		return false, ErrClosed
	case on == (d.rec != nil):
		return false, nil
	case on:
		rec, err := acquireRecorder(d.cfg.Window, uint64(d.cfg.FileBytesMax()/2))
		if err != nil {
			return false, err
		}
		d.rec = rec
	default:
		d.rec.release()
		d.rec = nil
	}
	return true, nil
}

// Collector exports synod_stall_traces_total.
func (d *Detector) Collector() prometheus.Collector { return d.traces }

// Stats are the detector's counters. Written, Failed and NoRoom count a
// snapshot only once its log line is written: a caller that sees the count
// move finds the line in the log.
type Stats struct {
	Stalls  uint64 // Stalled calls
	Written uint64 // trace files written
	Skipped uint64 // stalls without a trace of their own
	Failed  uint64 // snapshots that could not be written
	NoRoom  uint64 // snapshots not written: SetRoom's check said no
}

// Stats returns the counters.
func (d *Detector) Stats() Stats {
	return Stats{Stalls: d.stalls.Load(), Written: d.written.Load(), Skipped: d.skipped.Load(), Failed: d.failed.Load(),
		NoRoom: d.noRoom.Load()}
}

// Stalled records a stall: it marks the trace, and starts a snapshot or
// logs the stall (rate-limited) without one. It never waits: not for I/O,
// and not for another Stalled call (one cause stalls many requests at
// once, and an overloaded node stalls every request: a call that finds
// another one recording only counts its stall, so the detector never
// becomes a lock the stalled loops queue on).
func (d *Detector) Stalled(ev Event) {
	d.stalls.Add(1)
	if !d.mu.TryLock() {
		d.skipped.Add(1)
		d.skippedC.Inc()
		return
	}
	now := d.cfg.Now()
	mark := d.rec != nil && d.marks.allow()
	why := ""
	switch {
	case d.closed:
		why = "detector closed"
	case d.rec == nil:
		why = "flight recorder off"
	case d.cfg.Dir == "":
		why = "no trace directory"
	case d.writing:
		why = "a trace is being written"
	case !d.lastTrace.IsZero() && now.Sub(d.lastTrace) < d.cfg.Every:
		why = fmt.Sprintf("at most one trace per %v", d.cfg.Every)
	}
	if why == "" {
		d.writing, d.lastTrace = true, now
		d.wg.Add(1)
		rec := d.rec
		d.mu.Unlock()
		markTrace(mark, ev) // before the snapshot starts, so it holds the mark
		go d.snapshot(ev, now, rec)
		return
	}
	line := d.lim.event(d.log.Warn())
	async := line != nil && !d.closed
	if async {
		d.lines.Add(1) // under mu: Close waits for it
	}
	d.mu.Unlock()
	markTrace(mark, ev)
	d.skipped.Add(1)
	d.skippedC.Inc()
	if line == nil {
		return
	}
	ev.fields(line).Str("trace", "").Str("no_trace", why)
	if !async {
		line.Msg("stall") // closed: shutting down, nobody waits on it
		return
	}
	// The write to the log's output is I/O: off the caller's goroutine
	// (at most logLinesPerSecMax such goroutines a second, one write
	// each).
	go func() {
		defer d.lines.Done()
		line.Msg("stall")
	}()
}

// markTrace puts ev's mark in the execution trace (when mark: the
// recorder runs and the marks' rate allows one).
func markTrace(mark bool, ev Event) {
	if mark && trace.IsEnabled() {
		trace.Log(context.Background(), TraceCategory, ev.String())
	}
}

// snapshot writes rec's window to a new file and logs the stall with its
// name. (rec may have stopped since, SetRecording: the write then fails
// and is counted as failed.)
func (d *Detector) snapshot(ev Event, at time.Time, rec *recorder) {
	defer d.wg.Done()
	if room := d.room.Load(); room != nil {
		if err := (*room)(d.cfg.FileBytesMax()); err != nil {
			d.mu.Lock()
			d.writing = false
			d.mu.Unlock()
			ev.fields(d.log.Warn()).Str("trace", "").Str("no_trace", err.Error()).Msg("stall")
			d.noRoom.Add(1)
			d.traces.WithLabelValues("no_room").Inc()
			return
		}
	}
	path, n, err := writeTrace(d.cfg, rec, ev, at)
	d.mu.Lock()
	d.writing = false
	d.mu.Unlock()
	if err != nil {
		ev.fields(d.log.Warn()).Str("trace", "").Err(err).Msg("stall")
		d.failed.Add(1)
		d.traces.WithLabelValues("failed").Inc()
		return
	}
	ev.fields(d.log.Warn()).Str("trace", path).Int64("trace_bytes", n).Msg("stall")
	d.written.Add(1)
	d.traces.WithLabelValues("written").Inc()
}

// Close stops taking snapshots, waits for one being written and releases
// the flight recorder.
func (d *Detector) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	rec := d.rec // fixed from here on: SetRecording refuses a closed detector
	d.mu.Unlock()
	d.wg.Wait()
	d.lines.Wait()
	if rec != nil {
		rec.release()
	}
	return nil
}

// String is the event as the trace mark and the file name carry it.
func (ev Event) String() string {
	return fmt.Sprintf("path=%s stage=%s took=%s slot=%d", ev.Path, ev.Stage, ev.Took, ev.Slot)
}

func (ev Event) fields(e *zerolog.Event) *zerolog.Event {
	return e.Str("path", ev.Path).Str("stage", ev.Stage).
		Float64("took_ms", float64(ev.Took.Microseconds())/1000).Uint64("slot", ev.Slot)
}

// lineLimiter allows max lines (or marks) per logWindow and counts the
// rest (callers hold Detector.mu).
type lineLimiter struct {
	now        func() time.Time
	max        int
	start      time.Time
	lines      int
	suppressed int
}

// allow reports whether one more is within the rate, counting it.
func (l *lineLimiter) allow() bool {
	if now := l.now(); now.Sub(l.start) >= logWindow || now.Before(l.start) {
		l.start, l.lines = now, 0
	}
	if l.lines >= l.max {
		l.suppressed++
		return false
	}
	l.lines++
	return true
}

// event returns ev with the count of lines suppressed before it, or nil
// (a disabled zerolog event) when this line is over the rate.
func (l *lineLimiter) event(ev *zerolog.Event) *zerolog.Event {
	if ev == nil {
		return nil
	}
	if !l.allow() {
		return nil
	}
	if l.suppressed > 0 {
		ev = ev.Int("suppressed", l.suppressed)
		l.suppressed = 0
	}
	return ev
}
