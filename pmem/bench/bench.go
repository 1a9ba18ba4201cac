// Package bench measures append+persist latency and throughput of the pmem
// log in each persist mode against a plain append-only file with
// fdatasync, for several record sizes, in one run on one machine. The
// pmembench command and kvbench call it.
//
// One operation is one Append of one record followed by one Persist (for
// the file: one write(2) of the same bytes followed by one fdatasync(2)).
// shm results do not survive a power loss; every shm row says so.
package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"golang.org/x/sys/unix"

	"synod/pmem"
)

const (
	latencyNanosMax = int64(10 * time.Second)
	latencySigFigs  = 3
	warmupOps       = 50
	slicesPerCell   = 10        // turns each cell gets, interleaved with the other targets
	fileRotateBytes = 256 << 20 // the baseline file starts over beyond this
	benchClusterID  = 1
	benchNodeID     = 1
)

// Config says what to measure. Zero fields take the defaults of Defaults.
type Config struct {
	Duration    time.Duration // measuring time per (target, size) cell, taken in turns
	OpsMax      int64         // at most this many operations per cell
	Dir         string        // disk filesystem: msync mode and the fdatasync file
	ShmDir      string        // tmpfs: shm mode
	DAXDir      string        // DAX filesystem; empty: dax only if Dir is DAX
	RegionBytes int64         // region of each pmem log
	Sizes       []int         // record payload sizes
}

// Defaults is the configuration of the short default run (< 1 minute).
func Defaults() Config {
	return Config{Duration: time.Second, OpsMax: 200000, Dir: "/var/tmp", ShmDir: "/dev/shm",
		RegionBytes: 64 << 20, Sizes: []int{64, 512, 4096}}
}

// Result is one (target, size) cell.
type Result struct {
	Target         string // "pmem dax", "pmem msync", "pmem shm", "file+fdatasync"
	Where          string // directory and filesystem
	Survives       string // what a persisted record survives
	Size           int    // payload bytes
	Ops            int64
	Wall           time.Duration
	P50, P99, P999 time.Duration
}

// OpsPerSec is the cell's throughput (one op at a time).
func (r Result) OpsPerSec() float64 { return float64(r.Ops) / r.Wall.Seconds() }

type cell struct {
	target   string
	where    string
	survives string
	size     int
	ops      int64
	wall     time.Duration
	hist     *hdrhistogram.Histogram
}

// DAXAvailable reports the directory dax mode would be measured in, or "".
func (c Config) DAXAvailable() string {
	if c.DAXDir != "" {
		return c.DAXDir
	}
	if m, err := pmem.DetectMode(filepath.Join(c.Dir, "probe")); err == nil && m == pmem.ModeDAX {
		return c.Dir
	}
	return ""
}

// Run measures every target at every size. The targets of one size take
// turns in short slices, so that a change of load on a shared machine hits
// them all alike.
func Run(cfg Config) ([]Result, error) {
	d := Defaults()
	if cfg.Duration <= 0 {
		cfg.Duration = d.Duration
	}
	if cfg.OpsMax <= 0 {
		cfg.OpsMax = d.OpsMax
	}
	if cfg.Dir == "" {
		cfg.Dir = d.Dir
	}
	if cfg.ShmDir == "" {
		cfg.ShmDir = d.ShmDir
	}
	if cfg.RegionBytes == 0 {
		cfg.RegionBytes = d.RegionBytes
	}
	if len(cfg.Sizes) == 0 {
		cfg.Sizes = d.Sizes
	}
	for _, s := range cfg.Sizes {
		if s < 0 || s > pmem.RecordPayloadBytesMax {
			return nil, fmt.Errorf("bench: record size %d out of 0..%d", s, pmem.RecordPayloadBytesMax)
		}
	}
	type target struct {
		name, dir string
		mode      pmem.Mode
	}
	var targets []target
	if dax := cfg.DAXAvailable(); dax != "" {
		targets = append(targets, target{"pmem dax", dax, pmem.ModeDAX})
	}
	targets = append(targets,
		target{"pmem msync", cfg.Dir, pmem.ModeMsync},
		target{"pmem shm", cfg.ShmDir, pmem.ModeShm},
		target{"file+fdatasync", cfg.Dir, ""})
	var out []Result
	for _, size := range cfg.Sizes {
		var runs []*run
		closeAll := func() {
			for _, r := range runs {
				r.close()
			}
		}
		for _, tg := range targets {
			var r *run
			var err error
			if tg.mode == "" {
				r, err = newFileRun(tg.dir, size)
			} else {
				r, err = newLogRun(tg.dir, tg.mode, cfg.RegionBytes, size)
			}
			if err != nil {
				closeAll()
				return nil, fmt.Errorf("bench: %s, %d B: %w", tg.name, size, err)
			}
			r.c.target = tg.name
			runs = append(runs, r)
		}
		for _, r := range runs {
			if err := r.warmup(); err != nil {
				closeAll()
				return nil, fmt.Errorf("bench: %s, %d B: %w", r.c.target, size, err)
			}
		}
		for range slicesPerCell {
			for _, r := range runs {
				if err := r.measure(cfg.Duration/slicesPerCell, cfg.OpsMax); err != nil {
					closeAll()
					return nil, fmt.Errorf("bench: %s, %d B: %w", r.c.target, size, err)
				}
			}
		}
		closeAll()
		for _, r := range runs {
			c := r.c
			out = append(out, Result{Target: c.target, Where: c.where, Survives: c.survives, Size: c.size,
				Ops: c.ops, Wall: c.wall,
				P50:  time.Duration(c.hist.ValueAtQuantile(50)),
				P99:  time.Duration(c.hist.ValueAtQuantile(99)),
				P999: time.Duration(c.hist.ValueAtQuantile(99.9))})
		}
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

func us(d time.Duration) string { return strconv.FormatFloat(float64(d.Nanoseconds())/1e3, 'f', 2, 64) }

// WriteTable writes results as a markdown table.
func WriteTable(w io.Writer, results []Result) {
	fmt.Fprintln(w, "| target | where | survives | record B | ops | p50 us | p99 us | p99.9 us | ops/s |")
	fmt.Fprintln(w, "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range results {
		fmt.Fprintf(w, "| %s | %s | %s | %d | %d | %s | %s | %s | %.0f |\n",
			r.Target, r.Where, r.Survives, r.Size, r.Ops, us(r.P50), us(r.P99), us(r.P999), r.OpsPerSec())
	}
}
