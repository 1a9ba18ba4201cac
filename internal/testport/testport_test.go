package testport

import "testing"

// TestFreeBelowEphemeralAndDistinct: 50 ports, none twice, each below the
// kernel's ephemeral range when it is known and bindable now.
func TestFreeBelowEphemeralAndDistinct(t *testing.T) {
	lo := ephemeralLow()
	seen := map[int]bool{}
	for i := 0; i < 50; i++ {
		p := Free(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if lo > pickMin+1000 && (p < pickMin || p >= lo) {
			t.Fatalf("port %d outside %d..%d (the ephemeral range starts at %d)", p, pickMin, lo-1, lo)
		}
	}
}
