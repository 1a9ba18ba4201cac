package rtl

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The resource budget of synod_accel_top at the default sizing (4096-slot
// window, 5 replicas, 32 tenants), as stated in README.md.
const (
	budgetLUTs  = 8000
	budgetFFs   = 5000
	budgetBRAMs = 24
	budgetDSPs  = 16
)

// synthResult is one line of `synth.sh`.
type synthResult struct {
	LUTs, FFs, BRAMs, DSPs int
}

// parseSynthLine reads "synod_accel_top default luts=N ffs=N brams=N ...".
func parseSynthLine(line string) (synthResult, error) {
	var r synthResult
	seen := 0
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(v)
		var dst *int
		switch k {
		case "luts":
			dst = &r.LUTs
		case "ffs":
			dst = &r.FFs
		case "brams":
			dst = &r.BRAMs
		case "dsps":
			dst = &r.DSPs
		default:
			continue
		}
		if err != nil {
			return r, fmt.Errorf("synth line %q: %s: %v", line, k, err)
		}
		*dst = n
		seen++
	}
	if seen != 4 {
		return r, fmt.Errorf("synth line %q: want luts, ffs, brams and dsps", line)
	}
	return r, nil
}

// overBudget lists every figure of r above the budget.
func overBudget(r synthResult) []string {
	var over []string
	check := func(name string, got, max int) {
		if got > max {
			over = append(over, fmt.Sprintf("%s=%d > %d", name, got, max))
		}
	}
	check("luts", r.LUTs, budgetLUTs)
	check("ffs", r.FFs, budgetFFs)
	check("brams", r.BRAMs, budgetBRAMs)
	check("dsps", r.DSPs, budgetDSPs)
	return over
}

// synthTop runs `synth.sh --top` (Yosys, a few minutes), caching the line
// it prints under the temp dir by a hash of the sources, the script and
// the Yosys version.
func synthTop(t *testing.T) string {
	t.Helper()
	ys := needTool(t, "yosys")
	h := sha256.New()
	ver, err := exec.Command(ys, "-V").Output()
	if err != nil {
		t.Fatalf("yosys -V: %v", err)
	}
	h.Write(ver)
	for _, f := range append(designFiles(t), "synth.sh") {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(data))
		h.Write(data)
	}
	cache := filepath.Join(os.TempDir(), "synod-rtl-synth", hex.EncodeToString(h.Sum(nil))[:20]+".txt")
	if data, err := os.ReadFile(cache); err == nil {
		return strings.TrimSpace(string(data))
	}
	out, err := exec.Command("bash", "synth.sh", "--top").CombinedOutput()
	if err != nil {
		t.Fatalf("synth.sh --top: %v\n%s", err, tail(string(out), 3000))
	}
	line := ""
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "synod_accel_top ") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("synth.sh --top printed no result:\n%s", tail(string(out), 3000))
	}
	if err := os.MkdirAll(filepath.Dir(cache), 0o755); err == nil {
		tmp := cache + fmt.Sprintf(".%d", os.Getpid())
		if os.WriteFile(tmp, []byte(line+"\n"), 0o644) == nil {
			os.Rename(tmp, cache)
		}
	}
	return line
}

// TestSynthBudget synthesizes the top for the default sizing and fails if
// it exceeds the budget stated in README.md.
func TestSynthBudget(t *testing.T) {
	line := synthTop(t)
	r, err := parseSynthLine(line)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("rtl: luts=%d ffs=%d brams=%d dsps=%d (budget luts<=%d ffs<=%d brams<=%d dsps<=%d; synod_accel_top W=4096 R=5 T=32, xc7)\n",
		r.LUTs, r.FFs, r.BRAMs, r.DSPs, budgetLUTs, budgetFFs, budgetBRAMs, budgetDSPs)
	if over := overBudget(r); len(over) > 0 {
		t.Errorf("synod_accel_top over budget: %s", strings.Join(over, ", "))
	}
}

// TestBudgetCheckRejects shows the budget check fails a design over any one
// limit, and reads synth.sh's line format.
func TestBudgetCheckRejects(t *testing.T) {
	r, err := parseSynthLine("synod_accel_top default luts=100 ffs=100 brams=1 lutram=0 ramb36=1 ramb18=0 dsps=0 params=-")
	if err != nil || len(overBudget(r)) != 0 {
		t.Fatalf("a small design: %+v %v %v", r, err, overBudget(r))
	}
	for _, bad := range []synthResult{
		{LUTs: budgetLUTs + 1}, {FFs: budgetFFs + 1}, {BRAMs: budgetBRAMs + 1}, {DSPs: budgetDSPs + 1},
	} {
		if len(overBudget(bad)) != 1 {
			t.Errorf("%+v passed the budget", bad)
		}
	}
	if _, err := parseSynthLine("synod_accel_top default luts=x ffs=1 brams=1 dsps=1"); err == nil {
		t.Error("a malformed line parsed")
	}
}
