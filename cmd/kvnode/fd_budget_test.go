package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"synod/kv/replica"
	"synod/kv/server"
)

// TestFDBudget: the descriptors a node may need follow its caps, and a
// limit below them is logged with the keys that make them up; a limit at
// or above them, or an unknown one, is not.
func TestFDBudget(t *testing.T) {
	base := fdNeed(server.Config{})
	want := server.ConnsMaxDefault + server.ConnsUnauthenticatedMaxDefault + adminConnsMax + replica.SideConnsMax + pebbleOpenFilesMax + fdOtherMax
	if base != want {
		t.Fatalf("fdNeed with the defaults: %d, want %d", base, want)
	}
	if got := fdNeed(server.Config{ConnsMax: 5000}); got != base+5000-server.ConnsMaxDefault {
		t.Fatalf("fdNeed with conns_max 5000: %d, want %d", got, base+5000-server.ConnsMaxDefault)
	}
	for _, tc := range []struct {
		limit uint64
		warn  bool
	}{{1024, true}, {uint64(base) - 1, true}, {uint64(base), false}, {1 << 20, false}, {0, false}} {
		var buf bytes.Buffer
		got := warnFDLimit(base, tc.limit, server.Config{}, zerolog.New(&buf))
		if got != tc.warn || (buf.Len() > 0) != tc.warn {
			t.Fatalf("limit %d: warned %v (%q), want %v", tc.limit, got, buf.String(), tc.warn)
		}
		if tc.warn && (!strings.Contains(buf.String(), `"conns_max":1024`) || !strings.Contains(buf.String(), "descriptors_needed")) {
			t.Fatalf("limit %d: the warning does not name what makes up the need: %s", tc.limit, buf.String())
		}
	}
}
