package e2e

import (
	"os"
	"path/filepath"
	"testing"
)

// TestBypassCheckCatchesPlantedFaults plants the two faults checkBypass
// exists for: an AF_XDP node whose consensus went through the kernel, and
// a udp node the probe failed to count. Both must be flagged; the counts
// the real clusters produced must pass.
func TestBypassCheckCatchesPlantedFaults(t *testing.T) {
	kinds := []string{"afxdp", "afxdp", "udp"}
	cases := []struct {
		name   string
		counts []uint64
		commit uint64
		want   int
	}{
		{"as measured", []uint64{2, 21, 7365}, 2692, 0},
		{"afxdp node through the kernel", []uint64{2, 2700, 7365}, 2692, 1},
		{"udp node not counted", []uint64{2, 21, 0}, 2692, 1},
		{"both", []uint64{5000, 21, 10}, 2692, 2},
	}
	for _, tc := range cases {
		if got := bypassViolations(kinds, tc.counts, tc.commit); len(got) != tc.want {
			t.Errorf("%s: %d violations %q, want %d", tc.name, len(got), got, tc.want)
		}
	}
}

// TestServingTransportLastLine: the transport check reads the last
// "kvnode serving" line (a restarted node appends to its log), so a node
// that came back on the wrong transport is caught.
func TestServingTransportLastLine(t *testing.T) {
	p := filepath.Join(t.TempDir(), "node.log")
	log := `{"level":"info","transport":"afxdp","message":"kvnode serving"}
{"level":"info","message":"shutting down"}
{"level":"info","transport":"udp","message":"kvnode serving"}
`
	if err := os.WriteFile(p, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := servingTransport(p); got != "udp" {
		t.Fatalf("servingTransport = %q, want the last line's \"udp\"", got)
	}
	if got := servingTransport(filepath.Join(t.TempDir(), "missing.log")); got != "" {
		t.Fatalf("servingTransport of a missing log = %q, want \"\"", got)
	}
}
