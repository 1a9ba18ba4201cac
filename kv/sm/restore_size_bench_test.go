package sm

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// BenchmarkRestoreBySize restores a synthetic snapshot stream of
// SM_BENCH_RESTORE_MIB (default 1024) MiB of 4 KiB values under unique
// ordered keys, generated as it is read (no source store, no buffer), so
// that the staging side can be measured at the sizes a 10 GiB catch-up
// streams: does its MB/s fall as the LSM it builds grows? It reports the
// whole restore's MB/s, the last quarter's, and the CPU seconds it took
// per GB.
func BenchmarkRestoreBySize(b *testing.B) {
	mib := 1024
	if v := os.Getenv("SM_BENCH_RESTORE_MIB"); v != "" {
		mib, _ = strconv.Atoi(v)
	}
	for range b.N {
		dst, err := Open(b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		st := newSynthStream(int64(mib)<<20, 7)
		start, cpu0 := time.Now(), cpuTime()
		if err := dst.Restore(st); err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		// CPU per GB is what a catch-up under load pays: on a busy
		// machine the flushes and compactions that run beside the
		// parser on an idle one take their CPU from the same cores.
		// (It includes the generator's own, the same for any restore.)
		b.ReportMetric((cpuTime()-cpu0).Seconds()/(float64(st.n)/1e9), "cpu_s/GB")
		b.SetBytes(st.n)
		b.ReportMetric(float64(st.n)/1e6/took.Seconds(), "MB/s_restore")
		if q := st.quarterAt; !q.IsZero() {
			b.ReportMetric(float64(st.n/4)/1e6/time.Since(q).Seconds(), "MB/s_last_quarter")
		}
		dst.Close()
	}
}

// synthStream is a valid snapshot stream (the format writeSnapshot
// writes) of about size bytes of 4 KiB values at applied slot slot,
// produced on demand.
type synthStream struct {
	pr        *io.PipeReader
	n         int64     // bytes read so far
	size      int64     // target size
	quarterAt time.Time // when the reader passed 3/4 of size
}

func newSynthStream(size int64, slot uint64) *synthStream {
	pr, pw := io.Pipe()
	s := &synthStream{pr: pr, size: size}
	go func() {
		enc := newSnapEncoder(pw, snapshotMagic, slot)
		enc.record(appliedKey, binary.BigEndian.AppendUint64(nil, slot))
		r := rand.New(rand.NewPCG(3, 4))
		val := make([]byte, 4<<10)
		for i := int64(0); i*int64(len(val)) < size; i++ {
			for j := 0; j+8 <= len(val); j += 8 {
				binary.LittleEndian.PutUint64(val[j:], r.Uint64())
			}
			enc.record(dataKey(1, []byte(fmt.Sprintf("load-%012d", i))), val)
		}
		pw.CloseWithError(enc.end())
	}()
	return s
}

func (s *synthStream) Read(p []byte) (int, error) {
	k, err := s.pr.Read(p)
	before := s.n
	s.n += int64(k)
	if before < s.size*3/4 && s.n >= s.size*3/4 {
		s.quarterAt = time.Now()
	}
	return k, err
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSynthStream is the generator of BenchmarkRestoreBySize alone
// (read to nowhere): its cpu_s/GB is the part of that benchmark's figure
// that is not the restore's.
func BenchmarkSynthStream(b *testing.B) {
	mib := 1024
	if v := os.Getenv("SM_BENCH_RESTORE_MIB"); v != "" {
		mib, _ = strconv.Atoi(v)
	}
	for range b.N {
		st := newSynthStream(int64(mib)<<20, 7)
		cpu0 := cpuTime()
		if _, err := io.Copy(io.Discard, st); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(st.n)
		b.ReportMetric((cpuTime()-cpu0).Seconds()/(float64(st.n)/1e9), "cpu_s/GB")
	}
}
