package bench

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

func TestRunSmall(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "pmembench-")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no /dev/shm under CI: %v", err)
		}
		t.Skipf("no /dev/shm: %v", err)
	}
	defer os.RemoveAll(shm)
	res, err := Run(Config{Duration: 20 * time.Millisecond, OpsMax: 50, Dir: t.TempDir(), ShmDir: shm,
		RegionBytes: 1 << 20, Sizes: []int{64, 4096}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) < 6 {
		t.Fatalf("%d results, want 3 targets x 2 sizes at least", len(res))
	}
	for _, r := range res {
		if r.Ops <= 0 || r.P50 <= 0 || r.P50 > r.P99 || r.P99 > r.P999 {
			t.Fatalf("bad cell %+v", r)
		}
		if r.Target == "pmem shm" && !strings.Contains(r.Survives, "NOT power loss") {
			t.Fatalf("shm row does not say it loses data on power loss: %+v", r)
		}
	}
	var b bytes.Buffer
	WriteTable(&b, res)
	if strings.Count(b.String(), "\n") != len(res)+2 {
		t.Fatalf("table:\n%s", b.String())
	}
	if _, err := Run(Config{Sizes: []int{-1}}); err == nil {
		t.Fatal("negative record size accepted")
	}
}
