package accel

import (
	"path/filepath"
	"testing"

	"synod/pmem"
)

// openTestLog opens a small msync-mode pmem log in a temp dir.
func openTestLog(t *testing.T) *pmem.Log {
	t.Helper()
	l, _, err := pmem.Open(pmem.Options{
		Path:      filepath.Join(t.TempDir(), "log"),
		SizeBytes: pmem.RegionBytesMin,
		Mode:      pmem.ModeMsync,
		ClusterID: 1,
		NodeID:    2,
	})
	if err != nil {
		t.Fatalf("opening pmem log: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
