package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"synod/internal/stall"
)

// stallConfig is the example config with a [stall] table of body.
func stallConfig(t *testing.T, body string) []byte {
	return []byte(readExample(t) + "\n[stall]\n" + body)
}

func TestStallParse(t *testing.T) {
	c, err := parseConfig(stallConfig(t, `threshold = "5ms"
trace = true
trace_dir = "/var/tmp/stalls"
trace_files_max = 4
trace_bytes_max = 67108864
trace_every = "1s"
trace_window = "3s"
`))
	if err != nil {
		t.Fatal(err)
	}
	want := stall.Config{Threshold: 5 * time.Millisecond, Recorder: true, Dir: "/var/tmp/stalls", FilesMax: 4, BytesMax: 64 << 20,
		Every: time.Second, Window: 3 * time.Second}
	if got := c.Stall.cfg; got.Now != nil || fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Fatalf("stall config\n got %+v\nwant %+v", got, want)
	}
	// Absent: the defaults, traces under the data directory, and no
	// flight recorder (stallTraceDefault: it costs the tail).
	c, err = parseConfig([]byte(readExample(t)))
	if err != nil {
		t.Fatal(err)
	}
	got := c.Stall.cfg.WithDefaults()
	if c.Stall.off || got.Threshold != stall.ThresholdDefault || got.Recorder || stallTraceDefault ||
		got.Dir != filepath.Join(c.DataDir, "stalls") || got.FilesMax != stall.FilesMaxDefault {
		t.Fatalf("defaults: %+v", got)
	}
	// Off: no detector at all.
	c, err = parseConfig(stallConfig(t, `threshold = "off"`))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := c.stallDetector(zerolog.Nop()); d != nil || err != nil {
		t.Fatalf("threshold off: detector %v, %v; want none", d, err)
	}
}

func TestStallInvalid(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`threshold = "10us"`, "stall.threshold"},
		{`threshold = "fast"`, "stall.threshold"},
		{`threshold = "-1s"`, "stall.threshold"},
		{`trace_every = "1ms"`, "stall.trace_every"},
		{`trace_window = "2h"`, "stall.trace_window"},
		{`trace_files_max = 100000`, "stall.trace_files_max"},
		{`trace_bytes_max = 1024`, "stall.trace_bytes_max"},
		{`trace_dirr = "/tmp"`, "stall.trace_dirr"},
	} {
		_, err := parseConfig(stallConfig(t, tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("[stall] %s: %v; want an error naming %s", tc.body, err, tc.want)
		}
	}
}

// TestStallTraceRoom: a trace on data_dir's filesystem must leave the disk
// reserve free (walked at the byte), a failed reading refuses, no reserve
// allows; a trace directory on another filesystem is not checked.
func TestStallTraceRoom(t *testing.T) {
	data := t.TempDir()
	traces := filepath.Join(data, "stalls")
	if err := os.Mkdir(traces, 0o755); err != nil {
		t.Fatal(err)
	}
	const reserve, file = 96 << 20, 16 << 20
	var free int64
	var failed bool
	space := func() (int64, int64, bool, bool) { return free, reserve, free < reserve || failed, failed }
	room := stallTraceRoom(traces, data, space)
	if room == nil {
		t.Fatal("no room check for a trace directory inside data_dir")
	}
	for _, tc := range []struct {
		free   int64
		failed bool
		ok     bool
	}{{reserve + file, false, true}, {reserve + file - 1, false, false}, {reserve - 1, false, false}, {1 << 40, true, false}} {
		free, failed = tc.free, tc.failed
		if err := room(file); (err == nil) != tc.ok {
			t.Errorf("free %d, failed reading %v: %v, want ok=%v", tc.free, tc.failed, err, tc.ok)
		}
	}
	off := stallTraceRoom(traces, data, func() (int64, int64, bool, bool) { return 0, 0, false, false })
	if err := off(file); err != nil {
		t.Errorf("with the reserve off: %v", err)
	}
	var a, b unix.Stat_t
	if unix.Stat("/dev/shm", &a) == nil && unix.Stat(data, &b) == nil && a.Dev != b.Dev {
		if stallTraceRoom("/dev/shm", data, space) != nil {
			t.Error("a trace directory on another filesystem got a room check against data_dir's reserve")
		}
	}
}
