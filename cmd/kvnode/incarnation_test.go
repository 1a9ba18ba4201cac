package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNextIncarnation: the consensus incarnation grows across restarts
// whatever the clock does: the clock's reading when it is ahead of the
// record, one more than the record when it is behind (a clock stepped
// back), recorded each time; a file that is not one number is an error
// naming it. Peers refuse a sender whose incarnation went back
// (kv/replica TestAuthRestartWithClockBehind shows it), so without the
// record a node restarted with its clock behind was deaf to them.
func TestNextIncarnation(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Unix(1_800_000_000, 0)
	inc1, behind, err := nextIncarnation(dir, t0)
	if err != nil || behind || inc1 != uint64(t0.UnixNano()) {
		t.Fatalf("first start: %d %v %v, want %d", inc1, behind, err, t0.UnixNano())
	}
	inc2, behind, err := nextIncarnation(dir, t0.Add(time.Minute))
	if err != nil || behind || inc2 != uint64(t0.Add(time.Minute).UnixNano()) {
		t.Fatalf("clock ahead: %d %v %v", inc2, behind, err)
	}
	for i, back := range []time.Duration{time.Hour, time.Nanosecond, 0} {
		inc3, behind, err := nextIncarnation(dir, t0.Add(time.Minute-back))
		if err != nil || !behind || inc3 != inc2+1 {
			t.Fatalf("clock %v behind (start %d): %d %v %v, want %d", back, i, inc3, behind, err, inc2+1)
		}
		inc2 = inc3
	}
	b, err := os.ReadFile(filepath.Join(dir, incarnationFileName))
	if err != nil || strings.TrimSpace(string(b)) == "" {
		t.Fatalf("the record: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, incarnationFileName+".tmp")); !os.IsNotExist(err) {
		t.Fatalf("a temporary file is left: %v", err)
	}
	for _, bad := range []string{"", "\n", "abc\n", "0\n", "-5\n", "18446744073709551615\n", "1 2\n", strings.Repeat("9", 70)} {
		if err := os.WriteFile(filepath.Join(dir, incarnationFileName), []byte(bad), 0o640); err != nil {
			t.Fatal(err)
		}
		if _, _, err := nextIncarnation(dir, t0); err == nil || !strings.Contains(err.Error(), incarnationFileName) {
			t.Fatalf("record %q: %v, want an error naming the file", bad, err)
		}
	}
}
