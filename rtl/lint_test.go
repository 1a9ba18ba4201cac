package rtl

import (
	"os/exec"
	"testing"
)

// TestLint runs `verilator --lint-only -Wall` with each design module as the
// top: the sources must be warning-free (waivers only where commented).
func TestLint(t *testing.T) {
	vl := needTool(t, "verilator")
	files := designFiles(t)
	for _, m := range designModules {
		args := append([]string{"--lint-only", "-Wall", "--top-module", m}, files...)
		out, err := exec.Command(vl, args...).CombinedOutput()
		if err != nil || len(out) > 0 {
			t.Errorf("verilator lint of %s: %v\n%s", m, err, out)
		}
	}
}
