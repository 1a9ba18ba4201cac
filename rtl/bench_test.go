package rtl

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// bench is one self-checking Icarus testbench (rtl/tb/) and the design
// files it needs.
type bench struct {
	name   string   // subtest name
	top    string   // testbench module
	srcs   []string // design files after synod_pkg.sv
	params []string // -P overrides, "name=value"
}

var benches = []bench{
	{"quorum_agg_R3", "tb_quorum_agg", []string{"synod_quorum_agg.sv"}, []string{"REPLICAS=3"}},
	{"quorum_agg_R5", "tb_quorum_agg", []string{"synod_quorum_agg.sv"}, []string{"REPLICAS=5"}},
	{"accept_check", "tb_accept_check", []string{"synod_accept_check.sv"}, nil},
	{"timers", "tb_timers", []string{"synod_timers.sv"}, nil},
	{"divu", "tb_divu", []string{"synod_divu.sv"}, nil},
	{"shaper", "tb_shaper", []string{"synod_divu.sv", "synod_bucket.sv", "synod_shaper.sv"}, nil},
}

// runBench compiles and runs b under Icarus and returns its output. The
// benches print "PASS <name> checks=N" or "FAIL ..." lines (tb/tb_util.svh).
func runBench(t *testing.T, b bench) string {
	t.Helper()
	iv := needTool(t, "iverilog")
	vvp := needTool(t, "vvp")
	bin := filepath.Join(t.TempDir(), b.top+".vvp")
	args := []string{"-g2012", "-I", "tb", "-o", bin, "-s", b.top}
	for _, p := range b.params {
		args = append(args, "-P", b.top+"."+p)
	}
	args = append(args, "synod_pkg.sv")
	args = append(args, b.srcs...)
	args = append(args, filepath.Join("tb", b.top+".sv"))
	out, err := exec.Command(iv, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("iverilog %v: %v\n%s", args, err, out)
	}
	run, err := exec.Command(vvp, "-n", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("vvp %s: %v\n%s", b.top, err, run)
	}
	return string(run)
}

// TestBenches runs every module's self-checking testbench under Icarus.
// (Icarus prints "sorry: constant selects in always_* processes" for some
// always_comb blocks: it then makes them sensitive to whole vectors, which
// costs speed, not correctness.)
func TestBenches(t *testing.T) {
	for _, b := range benches {
		t.Run(b.name, func(t *testing.T) {
			out := runBench(t, b)
			if strings.Contains(out, "FAIL") || !strings.Contains(out, "PASS "+b.top) {
				t.Fatalf("%s:\n%s", b.top, out)
			}
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "PASS ") {
					t.Log(l)
				}
			}
		})
	}
}

// TestBenchCatchesPlantedBug runs the aggregator bench against a DUT that
// commits one ack early: the bench must fail.
func TestBenchCatchesPlantedBug(t *testing.T) {
	for _, r := range []int{3, 5} {
		b := bench{fmt.Sprintf("planted_R%d", r), "tb_quorum_agg", []string{"synod_quorum_agg.sv"},
			[]string{fmt.Sprintf("REPLICAS=%d", r), "PLANT=1"}}
		out := runBench(t, b)
		if !strings.Contains(out, "FAIL tb_quorum_agg") {
			t.Errorf("R=%d: the bench passed a DUT with quorum off by one:\n%s", r, out)
		}
	}
}
