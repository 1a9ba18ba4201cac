package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestParseMetrics reads a real-looking exposition: comments, label sets
// with spaces, braces and escaped quotes in values, timestamps, special
// float values.
func TestParseMetrics(t *testing.T) {
	text := `# HELP synod_leader_changes_total Times the leader changed.
# TYPE synod_leader_changes_total counter
synod_leader_changes_total 3

synod_overload_shed_total{class="bulk"} 1.25e+06
synod_overload_shed_total{class="critical"} 0
odd_labels{a="x} y",b="say \"hi\"",c="back\\slash"} 7 1700000000000
synod_snapshot_seconds_sum 0.5
synod_snapshot_seconds_count 2
go_gc_duration_seconds{quantile="0.5"} NaN
up +Inf
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	for series, want := range map[string]float64{
		metricLeaderChanges:                                   3,
		`synod_overload_shed_total{class="bulk"}`:             1.25e6,
		`synod_overload_shed_total{class="critical"}`:         0,
		`odd_labels{a="x} y",b="say \"hi\"",c="back\\slash"}`: 7,
		"synod_snapshot_seconds_sum":                          0.5,
		"synod_snapshot_seconds_count":                        2,
	} {
		if got, ok := m.get(series); !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	if _, ok := m.get("up"); !ok {
		t.Error("+Inf value not read")
	}
	if len(m) != 8 {
		t.Errorf("%d series, want 8: %v", len(m), m)
	}
}

// TestParseMetricsRefusesMalformed feeds the reader broken and oversized
// input: each must be refused with an error, never half-read or panicked
// on.
func TestParseMetricsRefusesMalformed(t *testing.T) {
	long := "x " + strings.Repeat("1", metricsLineBytesMax+1)
	var many strings.Builder
	for i := 0; i <= metricsSeriesMax; i++ {
		fmt.Fprintf(&many, "s%d 1\n", i)
	}
	var huge strings.Builder
	for huge.Len() <= metricsBytesMax {
		huge.WriteString("# padding padding padding padding padding padding padding padding\n")
	}
	for name, text := range map[string]string{
		"no value":            "synod_leader_changes_total\n",
		"no value after set":  "a{b=\"c\"}\n",
		"bad value":           "a 12abc\n",
		"three fields":        "a 1 2 3\n",
		"unterminated labels": "a{b=\"c} 1\n",
		"unterminated quote":  "a{b=\"c\\\"} 1\n",
		"bad name byte":       "a-b 1\n",
		"digit first":         "1a 1\n",
		"no name":             "{a=\"b\"} 1\n",
		"line too long":       long,
		"too many series":     many.String(),
		"too many bytes":      huge.String(),
		"nul in name":         "a\x00b 1\n",
	} {
		if m, err := parseMetrics(strings.NewReader(text)); err == nil {
			t.Errorf("%s: accepted (%d series)", name, len(m))
		}
	}
}

// FuzzParseMetrics: no input makes the reader panic, and whatever it
// accepts stays within its bounds.
func FuzzParseMetrics(f *testing.F) {
	f.Add("a 1\n")
	f.Add("a{b=\"c\"} 2 3\n# x\n")
	f.Add("a{b=\"}\\\"\"} 1\n")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseMetrics(strings.NewReader(s))
		if err == nil && len(m) > metricsSeriesMax {
			t.Fatalf("%d series", len(m))
		}
	})
}

func TestParseVmRSS(t *testing.T) {
	status := "Name:\tkvnode\nVmPeak:\t  999 kB\nVmRSS:\t   12345 kB\nThreads:\t9\n"
	if v, err := parseVmRSS([]byte(status)); err != nil || v != 12345<<10 {
		t.Fatalf("%d %v", v, err)
	}
	for _, bad := range []string{"Name:\tx\n", "VmRSS:\t12 MB\n", "VmRSS:\t-1 kB\n", "VmRSS:\tx kB\n", "VmRSS:\n"} {
		if v, err := parseVmRSS([]byte(bad)); err == nil {
			t.Errorf("%q read as %d", bad, v)
		}
	}
}
