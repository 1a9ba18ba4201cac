package rtl

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
)

// needTool returns the path of an HDL tool, skipping the test when it is
// missing, or failing it under CI=true, where a missing simulator means the
// co-simulation did not run (scripts/test.sh installs them).
func needTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not installed (CI=true): run scripts/test.sh or apt-get install verilator iverilog yosys", name)
		}
		t.Skipf("%s not installed: apt-get install -y verilator iverilog yosys", name)
	}
	trackSources(t)
	return p
}

// trackSources reads every HDL source, bench and script the tests hand to
// external tools. go test caches a passing result keyed on the files the
// test process itself opened; the simulators open these in child
// processes, so without this read an edited .sv file would leave a stale
// cached pass behind.
func trackSources(t testing.TB) {
	t.Helper()
	for _, pat := range []string{"*.sv", "tb/*.sv", "tb/*.svh", "cosim/*.cpp", "*.sh", "*.ys"} {
		files, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if _, err := os.ReadFile(f); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// designFiles lists the synthesizable sources, package first (every module
// refers to synod_pkg), in a stable order.
func designFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob("synod_*.sv")
	if err != nil || len(files) == 0 {
		t.Fatalf("no design files: %v", err)
	}
	sort.Strings(files)
	out := []string{"synod_pkg.sv"}
	for _, f := range files {
		if f != "synod_pkg.sv" {
			out = append(out, f)
		}
	}
	return out
}

// designModules are the modules lint and synthesis visit, top last.
var designModules = []string{
	"synod_members", "synod_accept_check", "synod_quorum_agg", "synod_timers",
	"synod_divu", "synod_bucket", "synod_shaper", "synod_accel_top",
}
