package rtt

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"synod/afxdp/netns"
)

// TestRunAllModes runs a short measurement of every transport and checks
// each answered every ping (no timing is asserted).
func TestRunAllModes(t *testing.T) {
	if err := netns.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true but %v", err)
		}
		t.Skip(err)
	}
	results, err := Run(Options{Pings: 300, Warmup: 50, Subnet: 61})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 3 {
		t.Fatalf("%d results", len(results))
	}
	for _, r := range results {
		if r.Pings != 300 || r.Lost != 0 || r.P50 <= 0 || r.P50 > r.P99 || r.P99 > r.P999 {
			t.Fatalf("%+v", r)
		}
	}
	var b bytes.Buffer
	WriteTable(&b, results)
	if !strings.Contains(b.String(), "| afxdp-busy | native | yes | 300 |") {
		t.Fatalf("table:\n%s", b.String())
	}
}

func TestOptionsRejected(t *testing.T) {
	for _, o := range []Options{{Pings: -1}, {PayloadBytes: 8}, {Modes: []string{"carrier-pigeon"}}, {Warmup: -1}} {
		if err := o.defaults(); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
