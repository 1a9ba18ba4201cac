package sm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/tenants"
)

// BenchmarkRestore measures staging a snapshot stream of benchStore's
// SM_BENCH_MIB (default 256) MiB of 4 KiB values into a fresh state
// machine: what a follower's catch-up by snapshot costs on this
// side of the network. It reports MB/s of stream.
func BenchmarkRestore(b *testing.B) {
	src := benchStore(b)
	defer src.Close()
	rc, _, err := src.Snapshot()
	if err != nil {
		b.Fatal(err)
	}
	stream, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(stream)))
	b.ResetTimer()
	for range b.N {
		dst, err := Open(b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := dst.Restore(bytes.NewReader(stream)); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(len(stream))/1e6/time.Since(start).Seconds(), "MB/s_restore")
		dst.Close()
	}
}

// benchStore is a state machine holding SM_BENCH_MIB (default 256) MiB of
// 4 KiB incompressible values under unique keys, 64 puts per slot.
func benchStore(b *testing.B) *SM {
	mib := 256
	if v := os.Getenv("SM_BENCH_MIB"); v != "" {
		mib, _ = strconv.Atoi(v)
	}
	src, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	val := make([]byte, 4<<10)
	r := rand.New(rand.NewPCG(1, 2))
	const perSlot = 64
	slot := uint64(0)
	for i := 0; i < mib*256; i += perSlot {
		var cmds [][]byte
		for k := i; k < i+perSlot; k++ {
			for j := 0; j+8 <= len(val); j += 8 {
				v := r.Uint64()
				for n := range 8 {
					val[j+n] = byte(v >> (8 * n))
				}
			}
			cmds = append(cmds, EncodeCommand(tenants.ID(1), &proto.Request{Op: proto.OpPut, ClientID: 1, Seq: uint64(k + 1), FirstUnacked: uint64(k + 1),
				Key: []byte(fmt.Sprintf("load-%012d", k)), Value: val}))
		}
		slot++
		if _, err := src.Apply(slot, cmds); err != nil {
			b.Fatal(err)
		}
	}
	return src
}

// BenchmarkSnapshotStream measures reading a snapshot stream of the same
// store: what the serving side's state machine produces (iterator, record
// framing, checksum, pipe) before the network. It reports MB/s of stream.
func BenchmarkSnapshotStream(b *testing.B) {
	src := benchStore(b)
	defer src.Close()
	cold := os.Getenv("SM_BENCH_COLD") != ""
	if cold {
		if _, err := src.Flush(); err != nil {
			b.Fatal(err)
		}
		if err := src.db.Compact(context.Background(), []byte{}, keyspaceEnd, true); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		if cold {
			b.StopTimer()
			dropPageCache(b)
			b.StartTimer()
		}
		start := time.Now()
		rc, _, err := src.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 1<<20) // the serving side's chunk (snapshotChunkBytesMax)
		var n int64
		for {
			k, err := io.ReadFull(rc, buf)
			n += int64(k)
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		rc.Close()
		b.SetBytes(n)
		b.ReportMetric(float64(n)/1e6/time.Since(start).Seconds(), "MB/s_stream")
	}
}

// dropPageCache empties the kernel's page cache (root only), so a
// benchmark reads its files from the disk as a node whose state exceeds
// its memory does.
func dropPageCache(b *testing.B) {
	exec.Command("sync").Run()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		b.Skipf("dropping the page cache needs root: %v", err)
	}
}
