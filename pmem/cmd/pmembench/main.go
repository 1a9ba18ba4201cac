// Command pmembench measures append+persist latency and throughput of the
// pmem log in each persist mode against a plain append-only file with
// fdatasync, for several record sizes, on this machine in one run.
//
//	go run ./pmem/cmd/pmembench                 # default: ~1 s per cell, < 1 minute
//	go run ./pmem/cmd/pmembench -duration 5s -sizes 64,512,4096,65536
//
// Each operation is one Append of one record followed by one Persist (for
// the file: one write(2) followed by one fdatasync(2)). shm results do not
// survive a power loss; the table says so on every shm row.
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"golang.org/x/sys/unix"

	"synod/pmem"
)

const (
	latencyNanosMax  = int64(10 * time.Second)
	latencySigFigs   = 3
	warmupOps        = 50
	slicesPerCell    = 10        // turns each cell gets, interleaved with the other targets
	fileRotateBytes  = 256 << 20 // the baseline file starts over beyond this
	benchClusterID   = 1
	benchNodeID      = 1
	defaultSizesList = "64,512,4096"
)

type cell struct {
	target   string // "pmem dax", "pmem msync", "pmem shm", "file+fdatasync"
	where    string
	survives string
	size     int
	ops      int64
	wall     time.Duration
	hist     *hdrhistogram.Histogram
}

func main() {
	duration := flag.Duration("duration", time.Second, "measuring time per (target, size) cell, taken in turns")
	opsMax := flag.Int64("ops", 200000, "at most this many operations per cell")
	dir := flag.String("dir", "/var/tmp", "directory on the disk filesystem (msync mode and the fdatasync file)")
	shmDir := flag.String("shmdir", "/dev/shm", "directory on tmpfs (shm mode)")
	daxDir := flag.String("daxdir", "", "directory on a DAX filesystem (dax mode); empty: dax only if -dir is DAX")
	region := flag.Int64("region", 64<<20, "region bytes of each pmem log")
	sizesFlag := flag.String("sizes", defaultSizesList, "record payload sizes in bytes, comma-separated")
	flag.Parse()
	sizes, err := parseSizes(*sizesFlag)
	if err != nil {
		fail(err)
	}

	type target struct {
		name, dir string
		mode      pmem.Mode
	}
	var targets []target
	daxAt := *daxDir
	if daxAt == "" {
		if m, err := pmem.DetectMode(filepath.Join(*dir, "probe")); err == nil && m == pmem.ModeDAX {
			daxAt = *dir
		}
	}
	if daxAt != "" {
		targets = append(targets, target{"pmem dax", daxAt, pmem.ModeDAX})
	}
	targets = append(targets,
		target{"pmem msync", *dir, pmem.ModeMsync},
		target{"pmem shm", *shmDir, pmem.ModeShm},
		target{"file+fdatasync", *dir, ""})

	fmt.Printf("pmembench: %s/%s, %d CPUs, flush instruction %s, %v per cell (at most %d ops)\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), pmem.FlushInstruction(), *duration, *opsMax)
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("pmembench: load average at start %s", b)
	}
	if daxAt == "" {
		fmt.Printf("pmembench: no DAX filesystem (%s refuses MAP_SYNC): dax mode not measured\n", *dir)
	}
	var cells []cell
	for _, size := range sizes {
		// The targets of one size take turns in short slices, so that a
		// change of load on a shared machine hits them all alike.
		var runs []*run
		for _, tg := range targets {
			var r *run
			var err error
			if tg.mode == "" {
				r, err = newFileRun(tg.dir, size)
			} else {
				r, err = newLogRun(tg.dir, tg.mode, *region, size)
			}
			if err != nil {
				fail(fmt.Errorf("%s, %d B: %w", tg.name, size, err))
			}
			r.c.target = tg.name
			runs = append(runs, r)
		}
		for _, r := range runs {
			if err := r.warmup(); err != nil {
				fail(fmt.Errorf("%s, %d B: %w", r.c.target, size, err))
			}
		}
		for range slicesPerCell {
			for _, r := range runs {
				if err := r.measure(*duration/slicesPerCell, *opsMax); err != nil {
					fail(fmt.Errorf("%s, %d B: %w", r.c.target, size, err))
				}
			}
		}
		for _, r := range runs {
			r.close()
			cells = append(cells, r.c)
		}
	}
	printTable(os.Stdout, cells)
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("pmembench: load average at end %s", b)
	}
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n > pmem.RecordPayloadBytesMax {
			return nil, fmt.Errorf("bad record size %q (0..%d)", f, pmem.RecordPayloadBytesMax)
		}
		out = append(out, n)
	}
	return out, nil
}

func fsName(dir string) string {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return dir
	}
	switch st.Type {
	case unix.TMPFS_MAGIC:
		return dir + " (tmpfs)"
	case unix.EXT4_SUPER_MAGIC:
		return dir + " (ext4)"
	case unix.XFS_SUPER_MAGIC:
		return dir + " (xfs)"
	}
	return fmt.Sprintf("%s (fs 0x%x)", dir, st.Type)
}

// run is one (target, size) cell being measured.
type run struct {
	c     cell
	op    func() error
	close func()
}

// newLogRun opens a fresh log; each op is Append of one record + Persist.
func newLogRun(dir string, mode pmem.Mode, region int64, size int) (*run, error) {
	f, err := os.CreateTemp(dir, "pmembench-*.log")
	if err != nil {
		return nil, err
	}
	path := f.Name()
	f.Close()
	os.Remove(path)
	l, _, err := pmem.Open(pmem.Options{Path: path, SizeBytes: region, Mode: mode, ClusterID: benchClusterID, NodeID: benchNodeID})
	if err != nil {
		return nil, err
	}
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	rec := []pmem.Record{{Type: pmem.RecordEntry, Ballot: pmem.Ballot{Round: 1, Node: 1}, Payload: payload}}
	slot := uint64(0)
	op := func() error {
		rec[0].Slot = slot
		err := l.Append(rec)
		if errors.Is(err, pmem.ErrFull) {
			if err := l.TruncateBelow(slot); err != nil {
				return err
			}
			err = l.Append(rec)
		}
		if err != nil {
			return err
		}
		slot++
		return l.Persist()
	}
	return &run{
		c: cell{where: fsName(dir), survives: mode.Survives(), size: size,
			hist: hdrhistogram.New(1, latencyNanosMax, latencySigFigs)},
		op:    op,
		close: func() { l.Close(); os.Remove(path) },
	}, nil
}

// newFileRun creates an append-only file; each op is write(2) of one
// encoded record + fdatasync(2): the classic WAL. The file grows, so each
// fdatasync also persists the new size, as a plain append-only log does.
func newFileRun(dir string, size int) (*run, error) {
	f, err := os.CreateTemp(dir, "pmembench-*.wal")
	if err != nil {
		return nil, err
	}
	// The same bytes a pmem record takes: a 56-byte header, the payload,
	// padding to 64.
	buf := make([]byte, (56+size+63)&^63)
	written := int64(0)
	slot := uint64(0)
	op := func() error {
		binary.LittleEndian.PutUint64(buf[16:], slot)
		if written+int64(len(buf)) > fileRotateBytes {
			if err := f.Truncate(0); err != nil {
				return err
			}
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				return err
			}
			written = 0
		}
		if _, err := f.Write(buf); err != nil {
			return err
		}
		written += int64(len(buf))
		slot++
		return unix.Fdatasync(int(f.Fd()))
	}
	return &run{
		c: cell{where: fsName(dir), survives: "process crash and power loss", size: size,
			hist: hdrhistogram.New(1, latencyNanosMax, latencySigFigs)},
		op:    op,
		close: func() { f.Close(); os.Remove(f.Name()) },
	}, nil
}

func (r *run) warmup() error {
	for range warmupOps {
		if err := r.op(); err != nil {
			return err
		}
	}
	return nil
}

// measure runs ops for d (or until the cell holds opsMax ops).
func (r *run) measure(d time.Duration, opsMax int64) error {
	start := time.Now()
	for r.c.ops < opsMax {
		t0 := time.Now()
		if err := r.op(); err != nil {
			return err
		}
		t1 := time.Now()
		_ = r.c.hist.RecordValue(max(t1.Sub(t0).Nanoseconds(), 1))
		r.c.ops++
		if t1.Sub(start) >= d {
			break
		}
	}
	r.c.wall += time.Since(start)
	return nil
}

func us(ns int64) string { return strconv.FormatFloat(float64(ns)/1e3, 'f', 2, 64) }

func printTable(w io.Writer, cells []cell) {
	fmt.Fprintln(w, "| target | where | survives | record B | ops | p50 us | p99 us | p99.9 us | ops/s |")
	fmt.Fprintln(w, "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, c := range cells {
		fmt.Fprintf(w, "| %s | %s | %s | %d | %d | %s | %s | %s | %.0f |\n",
			c.target, c.where, c.survives, c.size, c.ops,
			us(c.hist.ValueAtQuantile(50)), us(c.hist.ValueAtQuantile(99)), us(c.hist.ValueAtQuantile(99.9)),
			float64(c.ops)/c.wall.Seconds())
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "pmembench:", err)
	os.Exit(1)
}
