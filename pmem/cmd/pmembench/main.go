// Command pmembench measures append+persist latency and throughput of the
// pmem log in each persist mode against a plain append-only file with
// fdatasync, for several record sizes, on this machine in one run (package
// synod/pmem/bench does the work).
//
//	go run ./pmem/cmd/pmembench                 # default: 1 s per cell, < 1 minute
//	go run ./pmem/cmd/pmembench -duration 5s -sizes 64,512,4096,65536
//
// shm results do not survive a power loss; the table says so on every shm
// row.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"synod/pmem"
	"synod/pmem/bench"
)

func main() {
	d := bench.Defaults()
	cfg := d
	flag.DurationVar(&cfg.Duration, "duration", d.Duration, "measuring time per (target, size) cell, taken in turns")
	flag.Int64Var(&cfg.OpsMax, "ops", d.OpsMax, "at most this many operations per cell")
	flag.StringVar(&cfg.Dir, "dir", d.Dir, "directory on the disk filesystem (msync mode and the fdatasync file)")
	flag.StringVar(&cfg.ShmDir, "shmdir", d.ShmDir, "directory on tmpfs (shm mode)")
	flag.StringVar(&cfg.DAXDir, "daxdir", "", "directory on a DAX filesystem (dax mode); empty: dax only if -dir is DAX")
	flag.Int64Var(&cfg.RegionBytes, "region", d.RegionBytes, "region bytes of each pmem log")
	sizes := flag.String("sizes", "64,512,4096", "record payload sizes in bytes, comma-separated")
	flag.Parse()
	cfg.Sizes = nil
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			fail(fmt.Errorf("bad record size %q", f))
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}

	fmt.Printf("pmembench: %s/%s, %d CPUs, flush instruction %s, %v per cell (at most %d ops)\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), pmem.FlushInstruction(), cfg.Duration, cfg.OpsMax)
	loadavg("start")
	if cfg.DAXAvailable() == "" {
		fmt.Printf("pmembench: no DAX filesystem (%s refuses MAP_SYNC): dax mode not measured\n", cfg.Dir)
	}
	results, err := bench.Run(cfg)
	if err != nil {
		fail(err)
	}
	bench.WriteTable(os.Stdout, results)
	loadavg("end")
}

func loadavg(when string) {
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("pmembench: load average at %s %s", when, b)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "pmembench:", err)
	os.Exit(1)
}
