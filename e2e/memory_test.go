package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
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
	// memScanLimit is the keys a read phase's SCAN asks for: with
	// megabyte values ScanReplyBytesMax stops it at the second or third.
	memScanLimit = 4
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
func TestMemoryBoundedByBudget(t *testing.T) {
	// Larger values by hand (kv/README.md "Memory": megabyte values).
	valueBytes := memEnvInt(t, "E2E_MEM_VALUE_BYTES", memValueBytes)
	memoryBoundedByBudget(t, valueBytes, os.Getenv("E2E_MEM_PAUSE_FOLLOWER") == "1")
}

// TestMemoryBoundedByBudgetLargeValues: the same with 64 KiB values.
func TestMemoryBoundedByBudgetLargeValues(t *testing.T) {
	memoryBoundedByBudget(t, memLargeValueBytes, false)
}

// TestMemoryBoundedWhileServingSnapshots: the same with a follower
// stopped for memPauseFor early in the load, so that it falls behind the
// 16 MiB logs and the leader serves it streamed snapshots under the load.
// This is where the bound broke (198-203 MiB of 192, kv/README.md
// "Memory": glibc kept Pebble's freed memory resident; internal/cmalloc).
// The run must have served a snapshot, or it proves nothing.
func TestMemoryBoundedWhileServingSnapshots(t *testing.T) {
	memoryBoundedByBudget(t, memValueBytes, true)
}

// memPauseAfter and memPauseFor: when and how long the serving-snapshots
// variant stops a follower.
const (
	memPauseAfter = 6 * time.Second
	memPauseFor   = 3 * time.Second
)

func memoryBoundedByBudget(t *testing.T, valueBytes int, pauseFollower bool) {
	// E2E_MEM_BUDGET_BYTES and E2E_MEM_PMEM_BYTES, by hand: another
	// budget and log size (an outside tester's megabyte writes ran on the
	// default 1 GiB budget with 256 MiB logs).
	budget := int64(memEnvInt(t, "E2E_MEM_BUDGET_BYTES", memBudgetBytes))
	pmemBytes := int64(memEnvInt(t, "E2E_MEM_PMEM_BYTES", memPMemBytes))
	tables := fmt.Sprintf("[memory]\nbudget_bytes = %d\n", budget)
	diagDir := os.Getenv("E2E_MEM_DIAG_DIR")
	if diagDir != "" {
		// Debugging the bound: pprof on, and memDiag saves each node's
		// runtime figures and heap profile at its largest resident set.
		tables += "[admin]\npprof = true\n"
	}
	c := newSizedLogCluster(t, t.TempDir(), "synod-e2e-mem-", 14, "", tables, pmemBytes)

	// Sample every node's resident set until the end.
	var (
		sampleMu sync.Mutex
		peak     = map[int]rssSample{} // node id -> the sample with the largest rss
		samples  int
		// diagSaved: the resident set memDiag last saved, per node
		// (the sampling goroutine's).
		diagSaved = map[int]int64{}
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
				if diagDir != "" && s.rss >= diagSaved[nd.id]+memDiagStepBytes {
					diagSaved[nd.id] = s.rss
					memDiag(diagDir, nd, s)
				}
			}
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
		}
	}()

	// E2E_MEM_CLIENTS (default 1) client connections and E2E_MEM_WRITERS
	// (default memWriters) writers among them, by hand: an outside
	// tester's RSS overshoot came with 4 connections of 256 pipelined
	// megabyte writes each (kv/README.md "Memory").
	clients := make([]*client.Client, memEnvInt(t, "E2E_MEM_CLIENTS", 1))
	for i := range clients {
		cl, err := client.Dial(context.Background(), c.endpoints(), tenantA.token, client.Options{RetriesMax: 40, RequestTimeout: memOpTimeout})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		clients[i] = cl
	}
	cl := clients[0]
	writers := memEnvInt(t, "E2E_MEM_WRITERS", memWriters)
	target := memDataFactor * budget
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
	if pauseFollower {
		go func() {
			time.Sleep(memPauseAfter)
			l := c.leader()
			for _, nd := range c.nodes {
				if nd != l {
					c.pause(nd, memPauseFor)
					break
				}
			}
		}()
	}
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := clients[w%len(clients)]
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

	// E2E_MEM_READERS readers (by hand; default none) then GET acknowledged
	// keys for E2E_MEM_READ_S seconds (default 30), spread over the client
	// connections, while the sampling goes on: the answers' side of the
	// budget (response budgets, read slots) with large values. Of their
	// reads, E2E_MEM_SCAN_PERCENT (default 0) are SCANs of up to
	// memScanLimit keys from an acknowledged one (linearizable: the
	// client has no stale SCAN).
	var reads, readFails atomic.Int64
	if os.Getenv("E2E_MEM_READERS") != "" {
		readers := memEnvInt(t, "E2E_MEM_READERS", 0)
		scanPercent := memEnvInt(t, "E2E_MEM_SCAN_PERCENT", 0)
		var keys []int64
		ackedKeys.Range(func(k, _ any) bool {
			keys = append(keys, k.(int64))
			return len(keys) < 4096
		})
		readEnd := time.Now().Add(time.Duration(memEnvInt(t, "E2E_MEM_READ_S", 30)) * time.Second)
		var failMu sync.Mutex
		failKinds := map[string]int{}
		var rwg sync.WaitGroup
		for r := 0; r < readers && len(keys) > 0; r++ {
			rwg.Add(1)
			go func() {
				defer rwg.Done()
				cl := clients[r%len(clients)]
				for time.Now().Before(readEnd) {
					ctx, cancel := ctxTimeout(memOpTimeout)
					var err error
					if k := memKey(keys[rand.IntN(len(keys))]); rand.IntN(100) < scanPercent {
						_, _, err = cl.Scan(ctx, k, nil, memScanLimit)
					} else {
						_, err = cl.GetStale(ctx, k)
					}
					cancel()
					if err != nil {
						readFails.Add(1)
						failMu.Lock()
						failKinds[memErrKind(err)]++
						failMu.Unlock()
						continue
					}
					reads.Add(1)
				}
			}()
		}
		rwg.Wait()
		t.Logf("reads: %d answered, %d failed %v", reads.Load(), readFails.Load(), failKinds)
		if reads.Load() == 0 {
			t.Errorf("E2E_MEM_READERS=%d: no read was answered in the read phase (%d failed): the phase measured nothing", readers, readFails.Load())
		}
	}

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
	var served float64
	for _, nd := range c.nodes {
		served += metricValue(nd, `synod_snapshot_transfers_total{direction="sent",result="ok"}`)
	}
	fmt.Printf("memory: budget_mib=%d data_mib=%.0f rss_max_mib=%.1f bound_mib=%d value_kib=%d paused_follower=%v snapshots_served=%.0f (node %d: anon %.1f file %.1f shmem %.1f MiB; %d samples; load %.1f MB/s, %d failed puts)\n",
		budget>>20, mib(acked.Load()), mib(top.rss), budget>>20, valueBytes>>10, pauseFollower, served, maxNode, mib(top.anon), mib(top.file), mib(top.shmem),
		samples, float64(acked.Load())/1e6/loadTime.Seconds(), failed.Load())
	if pauseFollower && served == 0 {
		t.Errorf("the paused follower was served no snapshot: the run did not test the bound while serving")
	}
	if acked.Load() < memDataFloorBytes {
		t.Fatalf("acknowledged %.0f MiB within %v, less than the %d MiB a meaningful run needs", mib(acked.Load()), loadFor, memDataFloorBytes>>20)
	}
	for id, s := range peak {
		if s.rss > budget {
			t.Errorf("node %d: resident set reached %.1f MiB (anon %.1f, file %.1f, shmem %.1f), over the %d MiB budget",
				id, mib(s.rss), mib(s.anon), mib(s.file), mib(s.shmem), budget>>20)
		}
	}
}

// memErrKind is the first words of a failed read's error, to tell the
// failures of a read phase apart (deadlines, THROTTLED, read slots).
func memErrKind(err error) string {
	s := err.Error()
	kind := ""
	if errors.Is(err, context.DeadlineExceeded) {
		kind = "deadline, last "
	}
	if i := strings.LastIndex(s, "synod: "); i >= 0 { // the status of the last answer
		s = s[i+len("synod: "):]
	}
	if i := strings.IndexAny(s, ": "); i > 0 {
		s = s[:i]
	}
	return kind + s[:min(len(s), 40)]
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

// memDiagStepBytes is how much a node's resident set must grow past its
// last saved peak before memDiag saves another (E2E_MEM_DIAG_DIR).
const memDiagStepBytes = 4 << 20

// memDiag saves node nd's Go runtime figures (/metrics: go_memstats_*,
// process_*) and heap profile (/debug/pprof/heap) at resident set s into
// dir, replacing the last ones: what the heap held at the node's largest
// RSS, and how much of the anonymous memory was not the Go runtime's
// (Pebble's manual memory, C malloc).
func memDiag(dir string, nd *node, s rssSample) {
	os.MkdirAll(dir, 0o755)
	get := func(path string) []byte {
		req, err := nd.adminRequest(http.MethodGet, path, nil)
		if err != nil {
			return nil
		}
		cl := http.Client{Timeout: 2 * time.Second}
		resp, err := cl.Do(req)
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return b
	}
	var keep strings.Builder
	fmt.Fprintf(&keep, "rss_mib %.1f anon_mib %.1f file_mib %.1f shmem_mib %.1f at %s\n",
		float64(s.rss)/(1<<20), float64(s.anon)/(1<<20), float64(s.file)/(1<<20), float64(s.shmem)/(1<<20), time.Now().Format(time.RFC3339Nano))
	for _, line := range strings.Split(string(get("/metrics")), "\n") {
		if strings.HasPrefix(line, "go_memstats_") || strings.HasPrefix(line, "go_gc_") || strings.HasPrefix(line, "synod_pebble_") || strings.HasPrefix(line, "synod_snapshot") {
			keep.WriteString(line + "\n")
		}
	}
	os.WriteFile(filepath.Join(dir, fmt.Sprintf("node%d-peak.txt", nd.id)), []byte(keep.String()), 0o644)
	if b := get("/debug/pprof/heap"); len(b) > 0 {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("node%d-peak.heap", nd.id)), b, 0o644)
	}
}

// memEnvInt is the positive integer in environment variable name, or def
// when it is unset (the memory tests' by-hand knobs).
func memEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}
