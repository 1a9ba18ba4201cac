package main

import (
	"math"
	"runtime"
	"testing"
)

// TestProcStatCPUParsed: the "cpu" line's first eight values are summed
// (guest time is inside user already) and the eighth is steal; a line
// that is not there, too short or not numbers is an error, never a
// figure.
func TestProcStatCPUParsed(t *testing.T) {
	h, err := parseProcStatCPU([]byte("cpu  100 0 50 800 10 0 5 35 7 0\ncpu0 50 0 25 400 5 0 2 18 0 0\n"))
	if err != nil || !h.ok || h.total != 1000 || h.steal != 35 {
		t.Fatalf("parsed %+v, %v; want total 1000, steal 35", h, err)
	}
	for _, bad := range []string{
		"",
		"cpu0 1 2 3 4 5 6 7 8\n",      // not the summary line
		"cpu 1 2 3 4 5 6 7\n",         // no steal column (kernels before 2.6.11)
		"cpu 1 2 3 4 5 6 7 x\n",       // not a number
		"cpu 1 2 3 4 5 6 7 -8\n",      // negative
		"intr 1 2 3 4 5 6 7 8 9 10\n", // another line first
		"cpu 1 2 3 4 5 6 7 99999999999999999999\n", // overflows uint64
	} {
		if h, err := parseProcStatCPU([]byte(bad)); err == nil || h.ok {
			t.Errorf("%q: parsed %+v, want an error", bad, h)
		}
	}
}

// TestStealPct: the stolen share of the CPU time between two readings;
// none when a reading failed, no time passed, or the counters went back.
func TestStealPct(t *testing.T) {
	a := hostCPU{total: 1000, steal: 35, ok: true}
	b := hostCPU{total: 1400, steal: 135, ok: true}
	if p := stealPct(a, b); p == nil || math.Abs(*p-25) > 1e-9 {
		t.Fatalf("stealPct = %v, want 25", p)
	}
	for name, pair := range map[string][2]hostCPU{
		"first failed":    {{}, b},
		"second failed":   {a, {}},
		"no time passed":  {a, a},
		"steal went back": {b, {total: 1500, steal: 100, ok: true}},
	} {
		if p := stealPct(pair[0], pair[1]); p != nil {
			t.Errorf("%s: %v, want none", name, *p)
		}
	}
	if runtime.GOOS == "linux" {
		if h := readHostCPU(); !h.ok || h.total == 0 {
			t.Fatalf("this machine's /proc/stat: %+v", h)
		}
	}
}
