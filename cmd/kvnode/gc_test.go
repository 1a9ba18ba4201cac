package main

import (
	"math"
	"testing"
)

// TestChooseGCPercent: the larger GOGC only under a memory limit, and
// never over an operator's GOGC.
func TestChooseGCPercent(t *testing.T) {
	for _, c := range []struct {
		env   string
		limit int64
		want  int
	}{
		{"", 512 << 20, gcPercentDefault},
		{"", math.MaxInt64, -1}, // no limit: the heap would be unbounded
		{"", gcPercentLimitMin, gcPercentDefault},
		{"", gcPercentLimitMin - 1, -1}, // a small limit: no room for the overshoot
		{"", 96 << 20, -1},
		{"100", 512 << 20, -1}, // the operator's choice
		{"off", 512 << 20, -1},
	} {
		if got := chooseGCPercent(c.env, c.limit); got != c.want {
			t.Errorf("GOGC=%q limit %d: %d, want %d", c.env, c.limit, got, c.want)
		}
	}
}
