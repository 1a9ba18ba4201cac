package stall

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// logBuffer collects a detector's log lines (written from its goroutines).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// linesOf waits for d's log lines in flight and decodes every line
// logged so far.
func (l *logBuffer) linesOf(t *testing.T, d *Detector) []map[string]any {
	t.Helper()
	d.lines.Wait()
	return l.lines(t)
}

// lines decodes every JSON line logged so far.
func (l *logBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.buf.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// fakeClock is a settable clock safe for the detector's goroutines.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// waitWritten waits until d has written n traces (or failed one).
func waitWritten(t *testing.T, d *Detector, n uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		st := d.Stats()
		if st.Failed > 0 {
			t.Fatalf("a trace failed: %+v", st)
		}
		if st.Written >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%d traces written after 20 s, want %d", d.Stats().Written, n)
}

// busy gives the trace something to hold.
func busy() {
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var keep [][]byte
			for i := 0; i < 2000; i++ {
				keep = append(keep, make([]byte, 512))
				if len(keep) > 64 {
					keep = keep[:0]
				}
			}
		}()
	}
	wg.Wait()
}

// TestStallTraceNamedInLogAndMarked: a stall writes a trace file of the
// recorder's window into the directory; the log line names the file with
// the path, stage, duration and slot, and the trace holds the stall's mark.
func TestStallTraceNamedInLogAndMarked(t *testing.T) {
	var lb logBuffer
	dir := t.TempDir()
	d, err := New(Config{Recorder: true, Dir: dir}, zerolog.New(&lb))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Threshold() != ThresholdDefault || !d.Recording() {
		t.Fatalf("threshold %v recording %v; want the default and a recorder", d.Threshold(), d.Recording())
	}
	busy()
	d.Stalled(Event{Path: "write", Stage: "persist", Took: 34 * time.Millisecond, Slot: 1234})
	waitWritten(t, d, 1)

	var line map[string]any
	for _, l := range lb.linesOf(t, d) {
		if l["message"] == "stall" && l["trace"] != "" {
			line = l
		}
	}
	if line == nil {
		t.Fatalf("no stall line names a trace: %s", lb.buf.String())
	}
	if line["path"] != "write" || line["stage"] != "persist" || line["slot"] != float64(1234) || line["took_ms"] != float64(34) {
		t.Fatalf("stall line %v: want path write, stage persist, slot 1234, took_ms 34", line)
	}
	file, _ := line["trace"].(string)
	if filepath.Dir(file) != dir || !strings.Contains(filepath.Base(file), "-write-persist-slot1234.trace") {
		t.Fatalf("trace file %q: want one in %s named for the stage and slot", file, dir)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("go 1.")) {
		t.Fatalf("%s does not start with an execution trace header: %q", file, b[:min(len(b), 16)])
	}
	if !bytes.Contains(b, []byte(TraceCategory)) || !bytes.Contains(b, []byte("stage=persist took=34ms slot=1234")) {
		t.Fatalf("%s (%d bytes) lacks the stall's mark", file, len(b))
	}
	if line["trace_bytes"] != float64(len(b)) {
		t.Fatalf("trace_bytes %v, file holds %d", line["trace_bytes"], len(b))
	}
}

// TestStallTraceNeedsRoom: with a room check set, a trace is written only
// when the check allows a file of FileBytesMax: refused, no file appears,
// the stall is counted no_room and its line says why; allowed again (after
// Every), the next stall gets its trace.
func TestStallTraceNeedsRoom(t *testing.T) {
	var lb logBuffer
	clk := newFakeClock()
	dir := t.TempDir()
	d, err := New(Config{Recorder: true, Dir: dir, Every: time.Minute, Now: clk.now}, zerolog.New(&lb))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var asked atomic.Int64
	var full atomic.Bool
	full.Store(true)
	d.SetRoom(func(n int64) error {
		asked.Store(n)
		if full.Load() {
			return fmt.Errorf("data_dir below its reserve")
		}
		return nil
	})
	ev := Event{Path: "write", Stage: "apply", Took: 40 * time.Millisecond, Slot: 9}
	d.Stalled(ev)
	for deadline := time.Now().Add(20 * time.Second); d.Stats().NoRoom == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the room check was not asked: %+v", d.Stats())
		}
	}
	if files, _ := os.ReadDir(dir); len(files) != 0 || asked.Load() != d.cfg.FileBytesMax() {
		t.Fatalf("refused room: %d files in the trace dir, room asked for %d bytes (want 0 files, %d bytes)", len(files), asked.Load(), d.cfg.FileBytesMax())
	}
	found := false
	for _, l := range lb.linesOf(t, d) {
		found = found || (l["message"] == "stall" && l["no_trace"] == "data_dir below its reserve")
	}
	if !found {
		t.Fatalf("no stall line says why no trace was written: %s", lb.buf.String())
	}
	full.Store(false)
	clk.advance(time.Minute)
	d.Stalled(ev)
	waitWritten(t, d, 1)
	if st := d.Stats(); st.NoRoom != 1 || st.Written != 1 {
		t.Fatalf("stats %+v: want 1 written and 1 without room", st)
	}
}

// TestStallRateLimited: one trace per Every, never two at once; stalls in
// between are logged without a trace (saying why), and those lines are
// rate-limited with the count of suppressed ones.
func TestStallRateLimited(t *testing.T) {
	var lb logBuffer
	clk := newFakeClock()
	d, err := New(Config{Recorder: true, Dir: t.TempDir(), Every: time.Minute, Now: clk.now}, zerolog.New(&lb))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ev := Event{Path: "read", Stage: "apply_wait", Took: 50 * time.Millisecond, Slot: 7}
	d.Stalled(ev)
	waitWritten(t, d, 1)
	for i := 0; i < 10; i++ {
		clk.advance(time.Millisecond)
		d.Stalled(ev)
	}
	st := d.Stats()
	if st.Written != 1 || st.Skipped != 10 || st.Stalls != 11 {
		t.Fatalf("stats %+v; want 1 written, 10 skipped of 11", st)
	}
	var skipped []map[string]any
	for _, l := range lb.linesOf(t, d) {
		if l["message"] == "stall" && l["trace"] == "" {
			skipped = append(skipped, l)
		}
	}
	if len(skipped) != logLinesPerSecMax {
		t.Fatalf("%d lines for 10 skipped stalls within a second; want %d (rate limit)", len(skipped), logLinesPerSecMax)
	}
	if why, _ := skipped[0]["no_trace"].(string); !strings.Contains(why, "at most one trace per 1m0s") {
		t.Fatalf("skipped line %v: want the rate limit as the reason", skipped[0])
	}
	// A second later the next line carries the count it suppressed.
	clk.advance(time.Second)
	d.Stalled(ev)
	last := lb.linesOf(t, d)
	if l := last[len(last)-1]; l["suppressed"] != float64(10-logLinesPerSecMax) {
		t.Fatalf("line after the window %v: want suppressed=%d", l, 10-logLinesPerSecMax)
	}
	// Past Every, a stall gets a trace again.
	clk.advance(time.Minute)
	d.Stalled(ev)
	waitWritten(t, d, 2)
}

// TestStallsWithoutRecorder: with the recorder off, stalls are counted
// and logged, and no file is written.
func TestStallsWithoutRecorder(t *testing.T) {
	var lb logBuffer
	dir := t.TempDir()
	d, err := New(Config{Dir: dir, Threshold: time.Millisecond}, zerolog.New(&lb))
	if err != nil {
		t.Fatal(err)
	}
	d.Stalled(Event{Path: "write", Stage: "apply", Took: 2 * time.Millisecond, Slot: 9})
	d.Close()
	ents, _ := os.ReadDir(dir)
	if st := d.Stats(); st.Stalls != 1 || st.Written != 0 || len(ents) != 0 {
		t.Fatalf("stats %+v, %d files; want one stall, no trace", st, len(ents))
	}
	l := lb.linesOf(t, d)
	if len(l) != 1 || l[0]["no_trace"] != "flight recorder off" || l[0]["slot"] != float64(9) {
		t.Fatalf("log %v; want one stall line saying the recorder is off", l)
	}
}

// TestSetRecordingAtRuntime: a detector started without the recorder
// writes no trace; turned on (SetRecording), the next stall gets one;
// turned off, the next does not again; a second call in the same state
// changes nothing, and a closed detector refuses.
func TestSetRecordingAtRuntime(t *testing.T) {
	var lb logBuffer
	clk := newFakeClock()
	dir := t.TempDir()
	d, err := New(Config{Dir: dir, Every: time.Second, Now: clk.now}, zerolog.New(&lb))
	if err != nil {
		t.Fatal(err)
	}
	ev := Event{Path: "write", Stage: "apply", Took: 30 * time.Millisecond, Slot: 5}
	d.Stalled(ev)
	if st := d.Stats(); d.Recording() || st.Written != 0 || st.Skipped != 1 {
		t.Fatalf("started off: recording %v, stats %+v; want no recorder, the stall skipped", d.Recording(), st)
	}
	for i, want := range []bool{true, false} {
		if changed, err := d.SetRecording(true); changed != want || err != nil {
			t.Fatalf("SetRecording(true) #%d: changed %v, %v; want %v", i+1, changed, err, want)
		}
	}
	if !d.Recording() {
		t.Fatal("SetRecording(true): not recording")
	}
	busy()
	clk.advance(2 * time.Second)
	d.Stalled(ev)
	waitWritten(t, d, 1)
	if changed, err := d.SetRecording(false); !changed || err != nil || d.Recording() {
		t.Fatalf("SetRecording(false): changed %v, %v, recording %v", changed, err, d.Recording())
	}
	clk.advance(2 * time.Second)
	d.Stalled(ev)
	if st := d.Stats(); st.Written != 1 || st.Skipped != 2 {
		t.Fatalf("stopped again: stats %+v; want 1 trace, 2 stalls without one", st)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("%d files in the trace directory; want the one trace", len(ents))
	}
	d.Close()
	if _, err := d.SetRecording(true); !errors.Is(err, ErrClosed) {
		t.Fatalf("SetRecording after Close: %v; want ErrClosed", err)
	}
}

// checkDirBound is the directory bound's checker: at most files trace
// files holding at most bytes.
func checkDirBound(dir string, files int, bytes int64) error {
	ts, err := listTraces(dir)
	if err != nil {
		return err
	}
	var total int64
	for _, t := range ts {
		total += t.bytes
	}
	if len(ts) > files || total > bytes {
		return fmt.Errorf("%d trace files of %d bytes; the bound is %d files, %d bytes", len(ts), total, files, bytes)
	}
	return nil
}

// fillDir plants n old trace files of size bytes each (sparse), one file
// that is not a trace, and a temporary file a crash left.
func fillDir(t *testing.T, dir string, n int, size int64) []string {
	t.Helper()
	var names []string
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("stall-20200101T0000%02d.000000Z-write-apply-slot%d.trace", i, i)
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(size)
		f.Close()
		names = append(names, name)
	}
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a trace"), 0o640)
	os.WriteFile(filepath.Join(dir, tmpPrefix+"stall-x.trace"), []byte("torn"), 0o640)
	return names
}

// dirBoundRun writes four traces into a directory holding more old
// traces than the bound allows and checks the bound after each.
func dirBoundRun(t *testing.T) error {
	dir := t.TempDir()
	const files, bytesMax = 3, 24 << 20
	old := fillDir(t, dir, 5, 5<<20)
	clk := newFakeClock()
	d, err := New(Config{Recorder: true, Dir: dir, FilesMax: files, BytesMax: bytesMax, Every: time.Second, Now: clk.now}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := os.Stat(filepath.Join(dir, tmpPrefix+"stall-x.trace")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a crash's temporary file survived New: %v", err)
	}
	for i := 1; i <= 4; i++ {
		busy()
		d.Stalled(Event{Path: "write", Stage: "persist", Took: time.Second, Slot: uint64(100 + i)})
		waitWritten(t, d, uint64(i))
		if err := checkDirBound(dir, files, bytesMax); err != nil {
			return fmt.Errorf("after trace %d: %w", i, err)
		}
		clk.advance(time.Second)
	}
	ts, _ := listTraces(dir)
	for _, f := range ts {
		for _, o := range old {
			if f.name == o {
				t.Errorf("old trace %s kept while newer ones were written", o)
			}
		}
	}
	if n := ts[len(ts)-1].name; !strings.HasSuffix(n, "-write-persist-slot104.trace") {
		t.Errorf("newest trace %s; want the last stall's", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "notes.txt")); err != nil {
		t.Errorf("a file that is not a trace was touched: %v", err)
	}
	return nil
}

// TestStallDirBounded: the directory never holds more than FilesMax
// traces or BytesMax bytes of them; the oldest go first, other files stay.
func TestStallDirBounded(t *testing.T) {
	if err := dirBoundRun(t); err != nil {
		t.Fatal(err)
	}
}

// TestStallDirBoundCatchesPlantedNoPrune plants a writer that never
// prunes: the bound's checker must catch it.
func TestStallDirBoundCatchesPlantedNoPrune(t *testing.T) {
	testingNoPrune = true
	defer func() { testingNoPrune = false }()
	err := dirBoundRun(t)
	if err == nil {
		t.Fatal("the directory bound check passed with pruning off")
	}
	t.Logf("caught: %v", err)
}

// TestStallTraceCutOffAtFileLimit: a snapshot larger than a file's share
// of the directory is discarded, not left half-written.
func TestStallTraceCutOffAtFileLimit(t *testing.T) {
	rec, err := acquireRecorder(time.Second, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.release()
	busy()
	dir := t.TempDir()
	cfg := Config{Dir: dir, FilesMax: 1, BytesMax: 64} // below any trace; Validate would refuse it
	if _, _, err := writeTrace(cfg.WithDefaults(), rec, Event{Path: "write", Stage: "apply"}, time.Now()); !errors.Is(err, errFileTooLarge) {
		t.Fatalf("writeTrace: %v; want errFileTooLarge", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("%d files left after a discarded trace", len(ents))
	}
}

// TestRecorderShared: detectors of one process share the one recorder; it
// runs until the last of them closes.
func TestRecorderShared(t *testing.T) {
	a, err := New(Config{Recorder: true, Dir: t.TempDir()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Recorder: true, Dir: t.TempDir()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if a.rec != b.rec {
		t.Fatal("two recorders in one process")
	}
	a.Close()
	busy()
	b.Stalled(Event{Path: "write", Stage: "apply", Took: time.Second})
	waitWritten(t, b, 1)
	b.Close()
	shared.mu.Lock()
	left := shared.rec
	shared.mu.Unlock()
	if left != nil {
		t.Fatal("the recorder still runs after every detector closed")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Threshold: time.Microsecond}, "threshold"},
		{Config{Threshold: 2 * time.Minute}, "threshold"},
		{Config{FilesMax: -1}, "trace_files_max"},
		{Config{FilesMax: FilesMax + 1}, "trace_files_max"},
		{Config{FilesMax: 16, BytesMax: 8 << 20}, "trace_bytes_max"},
		{Config{Every: time.Millisecond}, "trace_every"},
		{Config{Window: time.Millisecond}, "trace_window"},
	} {
		err := c.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v; want an error naming %s", c.cfg, err, c.want)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if got := (Config{}).FileBytesMax(); got != BytesMaxDefault/FilesMaxDefault {
		t.Fatalf("FileBytesMax %d", got)
	}
}

// TestStallMarksBounded: an overloaded node stalls every request; the
// trace gets at most marksPerSecMax marks a second, the counter all.
func TestStallMarksBounded(t *testing.T) {
	clk := newFakeClock()
	d, err := New(Config{Recorder: true, Now: clk.now}, zerolog.Nop()) // no directory: marks only
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const n = marksPerSecMax + 100
	for i := 0; i < n; i++ {
		d.Stalled(Event{Path: "write", Stage: "capped", Took: time.Second, Slot: uint64(i)})
	}
	var buf bytes.Buffer
	if _, err := d.rec.writeTo(&buf); err != nil {
		t.Fatal(err)
	}
	if got := bytes.Count(buf.Bytes(), []byte("stage=capped")); got != marksPerSecMax {
		t.Fatalf("%d marks in the trace for %d stalls in one second; want %d", got, n, marksPerSecMax)
	}
	if st := d.Stats(); st.Stalls != n {
		t.Fatalf("stats %+v; want every stall counted", st)
	}
}

// blockingWriter blocks every Write until release is closed.
type blockingWriter struct{ release chan struct{} }

func (b *blockingWriter) Write(p []byte) (int, error) {
	<-b.release
	return len(p), nil
}

// TestStalledNeverWaitsForTheLog: a log output that blocks (a full pipe,
// a stuck disk) does not block the loop that reports a stall.
func TestStalledNeverWaitsForTheLog(t *testing.T) {
	bw := &blockingWriter{release: make(chan struct{})}
	d, err := New(Config{Threshold: time.Millisecond}, zerolog.New(bw))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		for i := 0; i < 10; i++ {
			d.Stalled(Event{Path: "write", Stage: "persist", Took: 2 * time.Millisecond, Slot: uint64(i)})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Stalled blocked on a log output that does not take the line")
	}
	close(bw.release)
	d.Close()
	if st := d.Stats(); st.Stalls != 10 || st.Skipped != 10 {
		t.Fatalf("stats %+v; want 10 stalls, 10 without a trace", st)
	}
}

// TestStalledNeverWaitsForAnotherStall: while another call holds the
// detector (planted here by holding its lock), a stall is counted and
// the call returns at once.
func TestStalledNeverWaitsForAnotherStall(t *testing.T) {
	d, err := New(Config{Threshold: time.Millisecond}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	d.mu.Lock()
	done := make(chan struct{})
	go func() {
		d.Stalled(Event{Path: "write", Stage: "apply", Took: 2 * time.Millisecond, Slot: 1})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		d.mu.Unlock()
		t.Fatal("Stalled waited for another stall being recorded")
	}
	d.mu.Unlock()
	if st := d.Stats(); st.Stalls != 1 || st.Skipped != 1 {
		t.Fatalf("stats %+v; want the stall counted, without a trace", st)
	}
}

// slowLog is a log output whose writes take a while, as a log on a busy
// disk does.
type slowLog struct{ logBuffer }

func (l *slowLog) Write(p []byte) (int, error) {
	time.Sleep(100 * time.Millisecond)
	return l.logBuffer.Write(p)
}

// TestStatsCountAfterTheLine: Stats' contract, a snapshot is counted only
// once its line is in the log. With a slow log output, a caller that saw
// Written move must find the line that names the trace (CI once saw the
// count before the line, and an empty log).
func TestStatsCountAfterTheLine(t *testing.T) {
	var lb slowLog
	d, err := New(Config{Recorder: true, Dir: t.TempDir()}, zerolog.New(&lb))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	d.Stalled(Event{Path: "write", Stage: "persist", Took: 34 * time.Millisecond, Slot: 7})
	waitWritten(t, d, 1)
	for _, l := range lb.lines(t) {
		if l["message"] == "stall" && l["trace"] != "" {
			return
		}
	}
	t.Fatalf("Written=%d but no line names the trace: %q", d.Stats().Written, lb.buf.String())
}
