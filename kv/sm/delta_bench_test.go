package sm

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	"synod/kv/proto"
)

// BenchmarkDeltaCatchUp compares, in one run, the two ways a follower
// that holds the first SM_BENCH_DELTA_HAVE_PERCENT (66) % of a store of
// SM_BENCH_DELTA_MIB (256) MiB of 4 KiB values under keys that grow with
// time catches up: a whole stream restored into an empty state, and a
// delta transfer (checkpoint and digest, the server's delta stream,
// staged and installed). Both ends run in this process, so the CPU
// seconds are the pair's. It reports seconds and CPU seconds of each, the
// delta's bytes against the whole stream's, and the digest's share.
func BenchmarkDeltaCatchUp(b *testing.B) {
	mib, have := 256, 66
	if v := os.Getenv("SM_BENCH_DELTA_MIB"); v != "" {
		mib, _ = strconv.Atoi(v)
	}
	if v := os.Getenv("SM_BENCH_DELTA_HAVE_PERCENT"); v != "" {
		have, _ = strconv.Atoi(v)
	}
	const valBytes, perSlot = 4096, 64
	keys := mib << 20 / valBytes
	// Random values (incompressible), as kvbench's load writes them.
	random := make([]byte, 1<<20+valBytes)
	crand.Read(random)
	fill := func(s *SM, from, to int, slot *uint64) {
		for k := from; k < to; k += perSlot {
			cmds := make([][]byte, 0, perSlot)
			for i := k; i < min(k+perSlot, to); i++ {
				off := (i * 4099) % (1 << 20)
				cmds = append(cmds, EncodeCommand(1, &proto.Request{Op: proto.OpPut, ClientID: uint64(1 + i%8), Seq: uint64(i/8 + 1), FirstUnacked: uint64(i/8 + 1),
					Key: fmt.Appendf(nil, "load-%012d", i), Value: random[off : off+valBytes]}))
			}
			*slot++
			if _, err := s.Apply(*slot, cmds); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := s.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	for range b.N {
		b.StopTimer()
		server, err := Open(b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		fetcher, err := Open(b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		var ss, fs uint64
		split := keys * have / 100
		fill(server, 0, split, &ss)
		fill(fetcher, 0, split, &fs)
		fill(server, split, keys, &ss)
		// Settle both LSMs (no compaction of the fill runs beside the
		// measurements).
		for _, s := range []*SM{server, fetcher} {
			if err := s.db.Compact(context.Background(), []byte{}, keyspaceEnd, true); err != nil {
				b.Fatal(err)
			}
		}
		empty, err := Open(b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		// Whole: the server's stream into an empty state.
		start, cpu0 := time.Now(), cpuTime()
		rc, _, err := server.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		cr := &countReader{r: rc}
		if err := empty.Restore(cr); err != nil {
			b.Fatal(err)
		}
		rc.Close()
		wholeS, wholeCPU := time.Since(start).Seconds(), (cpuTime() - cpu0).Seconds()

		// Delta.
		start, cpu0 = time.Now(), cpuTime()
		st, err := fetcher.BeginDeltaStage()
		if err != nil {
			b.Fatal(err)
		}
		digest, err := st.Digest()
		if err != nil {
			b.Fatal(err)
		}
		digestS := time.Since(start).Seconds()
		rc, slot, err := server.SnapshotDelta(digest)
		if err != nil {
			b.Fatal(err)
		}
		dr := &countReader{r: rc}
		if _, err := io.Copy(st, dr); err != nil {
			b.Fatal(err)
		}
		rc.Close()
		if _, err := st.Finish(); err != nil {
			b.Fatal(err)
		}
		if err := fetcher.InstallStaged(slot); err != nil {
			b.Fatal(err)
		}
		deltaS, deltaCPU := time.Since(start).Seconds(), (cpuTime() - cpu0).Seconds()
		b.ReportMetric(wholeS, "whole_s")
		b.ReportMetric(wholeCPU, "whole_cpu_s")
		b.ReportMetric(deltaS, "delta_s")
		b.ReportMetric(deltaCPU, "delta_cpu_s")
		b.ReportMetric(digestS, "digest_s")
		b.ReportMetric(float64(cr.n)/1e6, "whole_MB")
		b.ReportMetric(float64(dr.n)/1e6, "delta_MB")
		server.Close()
		fetcher.Close()
		empty.Close()
	}
}

// countReader counts the bytes read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// BenchmarkDigest measures computeDigest alone over SM_BENCH_DELTA_MIB
// (256) MiB of 4 KiB values: what hashing a state costs per GB, on each
// side of a delta transfer.
func BenchmarkDigest(b *testing.B) {
	mib := 256
	if v := os.Getenv("SM_BENCH_DELTA_MIB"); v != "" {
		mib, _ = strconv.Atoi(v)
	}
	s, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	random := make([]byte, 1<<20+4096)
	crand.Read(random)
	var slot uint64
	for k := 0; k < mib<<20/4096; k += 64 {
		cmds := make([][]byte, 0, 64)
		for i := k; i < k+64; i++ {
			off := (i * 4099) % (1 << 20)
			cmds = append(cmds, EncodeCommand(1, &proto.Request{Op: proto.OpPut, ClientID: 1, Seq: uint64(i + 1), FirstUnacked: uint64(i + 1), Key: fmt.Appendf(nil, "load-%012d", i), Value: random[off : off+4096]}))
		}
		slot++
		if _, err := s.Apply(slot, cmds); err != nil {
			b.Fatal(err)
		}
	}
	s.Flush()
	if err := s.db.Compact(context.Background(), []byte{}, keyspaceEnd, true); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(mib) << 20)
	b.ResetTimer()
	for range b.N {
		cpu0 := cpuTime()
		if _, err := computeDigest(s.db, func() bool { return false }); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric((cpuTime()-cpu0).Seconds()/(float64(mib)/1024), "cpu_s/GiB")
	}
}
