package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"synod/kv/client"
)

// The memory check: data several times the budget through a 3-node
// cluster, every node's resident set sampled throughout.
const (
	// memBudgetBytes is every node's [memory] budget_bytes: a little more
	// than the least a node with a memPMemBytes log accepts.
	memBudgetBytes = 192 << 20
	// memPMemBytes is the acceptor log of each node: small, so that it
	// wraps and truncates many times (and counts little in the budget).
	memPMemBytes = 16 << 20
	// memDataFactor: the load stops once it acknowledged this many
	// budgets of values (unique keys: all of it is live data), or at
	// memLoadFor.
	memDataFactor = 2
	// memDataFloorBytes: the load must acknowledge at least this much
	// (the acceptor log wrapped and was truncated twice, and Pebble
	// flushed and compacted all along), or the run proves nothing.
	memDataFloorBytes = 2 * memPMemBytes
	// memValueBytes is the value size of the measurement (RSS
	// 580-1070 MB at 190 MiB of data); memLargeValueBytes the size that
	// once broke the bound (a follower at 262 MiB on the 192 MiB budget,
	// kv/README.md "Memory").
	memValueBytes      = 4 << 10
	memLargeValueBytes = 64 << 10
	memWriters         = 32
	memOpTimeout       = 20 * time.Second
	// memLoadFor bounds the load (the harness, not a speed claim). The
	// store loads 4 KiB values at 0.9-2.6 MB/s on the 2-core CI machine,
	// whatever the budget (1.5 MB/s with 1 GiB; issue 14), so within it
	// the load stays below the budget: E2E_MEM_LOAD_S=<seconds> runs it
	// longer, to the full memDataFactor (about 3 minutes at 2.2 MB/s).
	memLoadFor     = 45 * time.Second
	memSampleEvery = 50 * time.Millisecond
	// memReadBackKeys: acknowledged keys read back at the end.
	memReadBackKeys = 300
)

// rssSample is one reading of /proc/<pid>/status, in bytes.
type rssSample struct{ rss, anon, file, shmem int64 }

// readRSS reads process pid's resident set and its parts.
func readRSS(pid int) (rssSample, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return rssSample{}, err
	}
	var s rssSample
	seen := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		var dst *int64
		switch f[0] {
		case "VmRSS:":
			dst = &s.rss
		case "RssAnon:":
			dst = &s.anon
		case "RssFile:":
			dst = &s.file
		case "RssShmem:":
			dst = &s.shmem
		default:
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return rssSample{}, fmt.Errorf("%s: %v", line, err)
		}
		*dst = kb << 10
		seen++
	}
	if seen != 4 {
		return rssSample{}, fmt.Errorf("/proc/%d/status: %d of the 4 RSS lines", pid, seen)
	}
	return s, nil
}

// TestMemoryBoundedByBudget: three kvnodes with [memory] budget_bytes =
// memBudgetBytes take 4 KiB values (64 KiB in the LargeValues twin) under
// unique keys for memLoadFor (or E2E_MEM_LOAD_S seconds; at most
// memDataFactor budgets) (snapshots, log truncation, Pebble flushes and
// compactions all along), and no node's resident set (VmRSS, sampled every
// memSampleEvery from start to end) ever exceeds the budget: kvnode's
// documented bound (kv/README.md, "Memory"). A sample of the acknowledged
// keys reads back.
func TestMemoryBoundedByBudget(t *testing.T) { memoryBoundedByBudget(t, memValueBytes) }

// TestMemoryBoundedByBudgetLargeValues: the same with 64 KiB values.
func TestMemoryBoundedByBudgetLargeValues(t *testing.T) {
	memoryBoundedByBudget(t, memLargeValueBytes)
}

func memoryBoundedByBudget(t *testing.T, valueBytes int) {
	tables := fmt.Sprintf("[memory]\nbudget_bytes = %d\n", memBudgetBytes)
	c := newSizedLogCluster(t, t.TempDir(), "synod-e2e-mem-", 14, "", tables, memPMemBytes)

	// Sample every node's resident set until the end.
	var (
		sampleMu sync.Mutex
		peak     = map[int]rssSample{} // node id -> the sample with the largest rss
		samples  int
	)
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(memSampleEvery)
		defer tick.Stop()
		for {
			for _, nd := range c.nodes {
				if !nd.running() {
					continue
				}
				s, err := readRSS(nd.cmd.Process.Pid)
				if err != nil {
					continue // exiting; stopAll reports why
				}
				sampleMu.Lock()
				if s.rss > peak[nd.id].rss {
					peak[nd.id] = s
				}
				samples++
				sampleMu.Unlock()
			}
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
		}
	}()

	cl, err := client.Dial(context.Background(), c.endpoints(), tenantA.token, client.Options{RetriesMax: 40, RequestTimeout: memOpTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	target := int64(memDataFactor * memBudgetBytes)
	loadFor := memLoadFor
	if v := os.Getenv("E2E_MEM_LOAD_S"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("E2E_MEM_LOAD_S=%q: want a positive number of seconds", v)
		}
		loadFor = time.Duration(n) * time.Second
	}
	var (
		acked, next, failed atomic.Int64
		ackedKeys           sync.Map // key index -> value seed
		wg                  sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(loadFor)
	if os.Getenv("E2E_MEM_PAUSE_FOLLOWER") == "1" {
		// Reproduces the open RSS spike (kv/README.md "Memory"): a
		// follower stopped for 3 s falls behind the 16 MiB logs and
		// fetches streamed snapshots from the leader, whose resident set
		// then passes the budget. Off by default: the spike is open.
		go func() {
			time.Sleep(6 * time.Second)
			l := c.leader()
			for _, nd := range c.nodes {
				if nd != l {
					c.pause(nd, 3*time.Second)
					break
				}
			}
		}()
	}
	for w := 0; w < memWriters; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			val := make([]byte, valueBytes)
			for acked.Load() < target && time.Now().Before(deadline) {
				k := next.Add(1)
				seed := rand.Uint64()
				fillValue(val, seed) // incompressible: Pebble cannot shrink the data
				ctx, cancel := ctxTimeout(memOpTimeout)
				err := cl.Put(ctx, memKey(k), val)
				cancel()
				if err != nil {
					if failed.Add(1) <= 5 {
						t.Logf("put %d: %v", k, err)
					}
					continue
				}
				acked.Add(int64(valueBytes))
				ackedKeys.Store(k, seed)
			}
		}()
	}
	wg.Wait()
	loadTime := time.Since(start)

	// Read back a sample of what was acknowledged.
	var keys []int64
	ackedKeys.Range(func(k, _ any) bool {
		keys = append(keys, k.(int64))
		return len(keys) < memReadBackKeys
	})
	want := make([]byte, valueBytes)
	for _, k := range keys {
		seed, _ := ackedKeys.Load(k)
		fillValue(want, seed.(uint64))
		ctx, cancel := ctxTimeout(memOpTimeout)
		got, err := cl.Get(ctx, memKey(k))
		cancel()
		if err != nil || string(got) != string(want) {
			t.Errorf("acknowledged key %d: read back %d bytes, err %v", k, len(got), err)
		}
	}
	close(stopSampling)
	<-sampled

	sampleMu.Lock()
	defer sampleMu.Unlock()
	var top rssSample
	maxNode := 0
	for id, s := range peak {
		if s.rss > top.rss {
			top, maxNode = s, id
		}
	}
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	fmt.Printf("memory: budget_mib=%d data_mib=%.0f rss_max_mib=%.1f bound_mib=%d value_kib=%d (node %d: anon %.1f file %.1f shmem %.1f MiB; %d samples; load %.1f MB/s, %d failed puts)\n",
		memBudgetBytes>>20, mib(acked.Load()), mib(top.rss), memBudgetBytes>>20, valueBytes>>10, maxNode, mib(top.anon), mib(top.file), mib(top.shmem),
		samples, float64(acked.Load())/1e6/loadTime.Seconds(), failed.Load())
	if acked.Load() < memDataFloorBytes {
		t.Fatalf("acknowledged %.0f MiB within %v, less than the %d MiB a meaningful run needs", mib(acked.Load()), loadFor, memDataFloorBytes>>20)
	}
	for id, s := range peak {
		if s.rss > memBudgetBytes {
			t.Errorf("node %d: resident set reached %.1f MiB (anon %.1f, file %.1f, shmem %.1f), over the %d MiB budget",
				id, mib(s.rss), mib(s.anon), mib(s.file), mib(s.shmem), memBudgetBytes>>20)
		}
	}
}

func memKey(k int64) []byte { return []byte(fmt.Sprintf("mem/%012d", k)) }

// fillValue fills b with bytes drawn from seed.
func fillValue(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
}

// setPMemSize rewrites nd's config with an acceptor log of size bytes
// (writeConfig's is 64 MiB).
func setPMemSize(t *testing.T, nd *node, size int64) {
	t.Helper()
	b, err := os.ReadFile(nd.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	const line = "size_bytes = 67108864\n"
	if !strings.Contains(string(b), line) {
		t.Fatalf("%s: no %q line to replace", nd.cfgPath, strings.TrimSpace(line))
	}
	s := strings.Replace(string(b), line, fmt.Sprintf("size_bytes = %d\n", size), 1)
	if err := os.WriteFile(nd.cfgPath, []byte(s), 0o640); err != nil {
		t.Fatal(err)
	}
}
