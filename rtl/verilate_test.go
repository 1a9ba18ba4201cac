package rtl

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"synod/accel"
)

// cosimBuild is one Verilator build of synod_accel_top: the sizing
// parameters a trace header must match, and the planted bug switch.
type cosimBuild struct {
	WindowSlots, Replicas, Tenants int
	PlantQuorumOffByOne            bool
}

func buildFor(s accel.Spec) cosimBuild {
	return cosimBuild{WindowSlots: s.WindowSlots, Replicas: s.Replicas, Tenants: s.TenantsMax}
}

var (
	buildMu    sync.Mutex
	buildCache = map[cosimBuild]string{}
)

// verilate returns the path of the co-simulation binary for b, building it
// with `verilator --cc --exe --build` when needed. Builds are cached under
// the OS temp dir by a hash of every input (RTL sources, the C++ testbench,
// parameters, the Verilator version). The sources are read here, through
// the test, so `go test`'s own result cache notices when they change.
func verilate(t testing.TB, b cosimBuild) string {
	t.Helper()
	vl := needTool(t, "verilator")
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := buildCache[b]; ok {
		return p
	}
	files := append(designFiles(t), filepath.Join("cosim", "cosim_tb.cpp"))
	h := sha256.New()
	ver, err := exec.Command(vl, "--version").Output()
	if err != nil {
		t.Fatalf("verilator --version: %v", err)
	}
	h.Write(ver)
	fmt.Fprintf(h, "%+v %s\n", b, verilatorFlags)
	abs := make([]string, len(files))
	for i, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(data))
		h.Write(data)
		if abs[i], err = filepath.Abs(f); err != nil {
			t.Fatal(err)
		}
	}
	key := hex.EncodeToString(h.Sum(nil))[:20]
	dir := filepath.Join(os.TempDir(), "synod-rtl-cosim", key)
	bin := filepath.Join(dir, "cosim_tb")
	if _, err := os.Stat(bin); err == nil {
		buildCache[b] = bin
		return bin
	}
	// Build in a private directory and rename it into place, so concurrent
	// test processes never see a half-built binary.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), key+".tmp")
	if err != nil {
		t.Fatal(err)
	}
	plant := "1'b0"
	if b.PlantQuorumOffByOne {
		plant = "1'b1"
	}
	args := append(strings.Fields(verilatorFlags), "--top-module", "synod_accel_top", "--Mdir", filepath.Join(tmp, "obj"), "-o", filepath.Join(tmp, "cosim_tb"),
		fmt.Sprintf("-GWINDOW_SLOTS=%d", b.WindowSlots), fmt.Sprintf("-GREPLICAS=%d", b.Replicas),
		fmt.Sprintf("-GTENANTS=%d", b.Tenants), "-GPLANT_QUORUM_OFF_BY_ONE="+plant,
		"-CFLAGS", fmt.Sprintf("-DCOSIM_WINDOW_SLOTS=%d -DCOSIM_REPLICAS=%d -DCOSIM_TENANTS=%d",
			b.WindowSlots, b.Replicas, b.Tenants))
	args = append(args, abs...)
	cmd := exec.Command(vl, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		os.RemoveAll(tmp)
		t.Fatalf("verilator build %+v: %v\n%s", b, err, tail(string(out), 4000))
	}
	if err := os.Rename(tmp, dir); err != nil && !os.IsExist(err) {
		// Another process finished the same build first: use its binary.
		if _, serr := os.Stat(bin); serr != nil {
			t.Fatalf("installing build: %v", err)
		}
		os.RemoveAll(tmp)
	}
	buildCache[b] = bin
	return bin
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// verilatorFlags are the build's fixed options (part of the cache key).
const verilatorFlags = "--cc --exe --build -j 2 -O3 --x-assign fast --x-initial fast"

// runCosim replays the trace at in through the RTL build for its spec and
// returns the path of the RTL's trace (inputs and the RTL's outputs).
func runCosim(t testing.TB, b cosimBuild, in string) string {
	t.Helper()
	bin := verilate(t, b)
	out := strings.TrimSuffix(in, ".trace") + ".rtl.trace"
	res, err := exec.Command(bin, in, out).CombinedOutput()
	if err != nil {
		t.Fatalf("cosim_tb %s: %v\n%s", in, err, tail(string(res), 2000))
	}
	return out
}
