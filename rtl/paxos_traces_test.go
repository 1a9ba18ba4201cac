package rtl

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"

	"synod/accel"
)

// paxosGroupTest is the accel test that runs real paxos.Nodes (3 and 5 of
// them, 4 seeds each, leader isolations, message loss) with a plane beside
// every node, and writes each plane's trace to $ACCEL_TRACE_DIR.
const paxosGroupTest = "^TestCheckerWithPaxos$"

// paxosTraces records the paxos-driven traces by running that test in a
// child `go test` (the traces are ~170 MB, too big to commit) and returns
// their paths. The group's spec (256-slot window, 3 or 5 replicas, 32
// tenants) needs its own RTL builds.
func paxosTraces(t *testing.T) []string {
	t.Helper()
	return childTraces(t, "synod/accel", paxosGroupTest, 1, filepath.Join("..", "accel", "paxos_group_test.go"))
}

// childTraces runs `go test -count=runs -run run pkg` with ACCEL_TRACE_DIR
// set to a temp dir and returns the traces it wrote there, sorted. deps are the
// child's test files: they lie outside this package, so go test's result
// cache would not notice an edit to them; reading them here makes it.
func childTraces(t *testing.T, pkg, run string, runs int, deps ...string) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	for _, d := range deps {
		if _, err := os.ReadFile(d); err != nil {
			t.Fatalf("the trace-recording test moved: %v", err)
		}
	}
	dir := t.TempDir()
	cmd := exec.Command(goBin, "test", fmt.Sprintf("-count=%d", runs), "-run", run, pkg)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "ACCEL_TRACE_DIR="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("recording traces (go test -run %s %s): %v\n%s", run, pkg, err, tail(string(out), 3000))
	}
	paths, err := filepath.Glob(filepath.Join(dir, "*.trace"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("go test -run %s %s wrote no traces to ACCEL_TRACE_DIR (%v)", run, pkg, err)
	}
	sort.Strings(paths)
	return paths
}

// traceSpec reads a trace's header.
func traceSpec(t *testing.T, path string) accel.Spec {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := accel.NewTraceReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return tr.Spec()
}
