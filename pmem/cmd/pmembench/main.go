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
	duration := flag.Duration("duration", time.Second, "measuring time per (target, size) cell")
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
		for _, tg := range targets {
			var c cell
			var err error
			if tg.mode == "" {
				c, err = benchFile(tg.dir, size, *duration, *opsMax)
			} else {
				c, err = benchLog(tg.dir, tg.mode, *region, size, *duration, *opsMax)
			}
			if err != nil {
				fail(fmt.Errorf("%s, %d B: %w", tg.name, size, err))
			}
			c.target = tg.name
			cells = append(cells, c)
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

// benchLog times Append of one record + Persist on a fresh log.
func benchLog(dir string, mode pmem.Mode, region int64, size int, d time.Duration, opsMax int64) (cell, error) {
	f, err := os.CreateTemp(dir, "pmembench-*.log")
	if err != nil {
		return cell{}, err
	}
	path := f.Name()
	f.Close()
	os.Remove(path)
	defer os.Remove(path)
	l, _, err := pmem.Open(pmem.Options{Path: path, SizeBytes: region, Mode: mode, ClusterID: benchClusterID, NodeID: benchNodeID})
	if err != nil {
		return cell{}, err
	}
	defer l.Close()
	c := cell{where: fsName(dir), survives: mode.Survives(), size: size,
		hist: hdrhistogram.New(1, latencyNanosMax, latencySigFigs)}
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
	return measure(c, op, d, opsMax)
}

// benchFile times write(2) of one encoded record to an append-only file +
// fdatasync(2): the classic WAL. The file grows, so each fdatasync also
// persists the new size, as a plain append-only log does.
func benchFile(dir string, size int, d time.Duration, opsMax int64) (cell, error) {
	f, err := os.CreateTemp(dir, "pmembench-*.wal")
	if err != nil {
		return cell{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	c := cell{where: fsName(dir), survives: "process crash and power loss", size: size,
		hist: hdrhistogram.New(1, latencyNanosMax, latencySigFigs)}
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
	return measure(c, op, d, opsMax)
}

func measure(c cell, op func() error, d time.Duration, opsMax int64) (cell, error) {
	for range warmupOps {
		if err := op(); err != nil {
			return c, err
		}
	}
	start := time.Now()
	for c.ops < opsMax {
		t0 := time.Now()
		if err := op(); err != nil {
			return c, err
		}
		t1 := time.Now()
		_ = c.hist.RecordValue(max(t1.Sub(t0).Nanoseconds(), 1))
		c.ops++
		if t1.Sub(start) >= d {
			break
		}
	}
	c.wall = time.Since(start)
	return c, nil
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
