package main

import (
	"errors"
	"strings"
	"testing"

	"synod/kv/space"
)

// TestCheckReserve walks the reserve across the filesystem's size and its
// free space byte by byte: at or above the size an error naming the key,
// one byte below it none; below the free space nothing, one byte above a
// warning; 0 (off) is never checked, a failed reading is an error.
func TestCheckReserve(t *testing.T) {
	const size, free = 320 << 20, 100 << 20
	fs := func(string) (int64, int64, error) { return size, free, nil }
	for _, tc := range []struct {
		reserve      int64
		err, warning string
	}{
		{0, "", ""},
		{free, "", ""},
		{free + 1, "", "has 104857600 bytes free, below the disk reserve of 104857601"},
		{size - 1, "", "below the disk reserve of 335544319"},
		{size, "limits.disk_free_min_bytes: 335544320 is not below the size of data_dir's filesystem (335544320 bytes at /d)", ""},
		{size + 1, "limits.disk_free_min_bytes: 335544321 is not below", ""},
		{1 << 30, "every write would be refused NO_SPACE", ""},
	} {
		w, err := checkReserve("/d", tc.reserve, fs)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("reserve %d: %v", tc.reserve, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("reserve %d: error %v, want one containing %q", tc.reserve, err, tc.err)
		case tc.warning == "" && w != "":
			t.Errorf("reserve %d: warning %q, want none", tc.reserve, w)
		case tc.warning != "" && !strings.Contains(w, tc.warning):
			t.Errorf("reserve %d: warning %q, want one containing %q", tc.reserve, w, tc.warning)
		}
	}
	called := false
	if _, err := checkReserve("/d", 0, func(string) (int64, int64, error) { called = true; return 0, 0, nil }); err != nil || called {
		t.Fatalf("reserve off: %v, statfs called %v", err, called)
	}
	if _, err := checkReserve("/d", 1, func(string) (int64, int64, error) { return 0, 0, errors.New("planted") }); err == nil || !strings.Contains(err.Error(), "planted") {
		t.Fatalf("a failed reading: %v", err)
	}
	if s, f, err := space.FilesystemBytes(t.TempDir()); err != nil || s <= 0 || f < 0 || f > s {
		t.Fatalf("FilesystemBytes of a temporary directory: size %d free %d, %v", s, f, err)
	}
}
