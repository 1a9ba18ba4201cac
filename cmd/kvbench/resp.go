package main

// The resp path: synod's RESP endpoint (kv/resp) measured with the Redis
// project's own load generator, redis-benchmark, on a fresh 3-node Paxos
// cluster configured like the paxos path:
//
//	redis-benchmark -t set,get -P 16 -c 50 -n N -r KEYS -d VALUE_BYTES
//
// against the leader's resp_listen. redis-benchmark is closed-loop (each
// of the 50 connections keeps 16 commands in flight and sends the next
// batch when the last answer is in) and measures latency from its send,
// so its column is not the open-loop figure of the binary-protocol
// columns: it shows what the Redis protocol costs at saturation, the
// SET rows being the write path and the GET rows the read path.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"synod/bench/hist"
)

// redis-benchmark's shape, fixed: the command line.
const (
	respBenchClients  = 50
	respBenchPipeline = 16
	// respRequestsPerOp scales -n (requests per test) to the preset: the
	// offered rate times the phase length, times this.
	respRequestsPerOp = 10
	respRequestsMin   = 1000
	// respPortOffset: node i's resp_listen is base-port + 40 + i.
	respPortOffset = 40
	// respBenchTimeoutMin bounds one redis-benchmark run at least; it
	// gets 20 ms per request beyond that, to bound a stuck cluster.
	respBenchTimeoutMin = 2 * time.Minute
)

// respTenantToken is the resp path's tenant: uncontracted, so that the
// benchmark measures the endpoint and not a tenant's contract.
const respTenantToken = "kvbench-resp-token"

// respConfig renders the resp path's extra config of node i: its
// resp_listen (a top-level key) and its tenant (a table).
func respConfig(o *Options, i int, addr string) (top, tables string) {
	top = fmt.Sprintf("resp_listen = \"%s:%d\"\n", addr, o.BasePort+respPortOffset+i)
	tables = fmt.Sprintf("[[tenants]]\nid = %d\nname = \"kvbench-resp\"\ntoken = %q\n\n", o.Tenants+2, respTenantToken)
	return top, tables
}

// respBenchResult is one redis-benchmark test's figures.
type respBenchResult struct {
	requests int64
	seconds  float64
	rps      float64
	summary  hist.Summary
	curve    []hist.Point
}

// runRESPBench runs redis-benchmark against the leader's RESP port and
// fills pr's steady phase: reads are GET, writes SET.
func runRESPBench(ctx context.Context, o *Options, c *cluster, pr *PathResult) *PathResult {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		pr.Status, pr.Reason = "n/a", "redis-benchmark not installed (apt-get install redis-tools)"
		return pr
	}
	li, err := c.waitLeader(ctx, leaderWaitMax)
	if err != nil {
		pr.Status, pr.Reason = "failed", err.Error()
		return pr
	}
	host, _, err := net.SplitHostPort(c.endpoints[li])
	if err != nil {
		pr.Status, pr.Reason = "failed", err.Error()
		return pr
	}
	n := max(respRequestsMin, int(o.Rate*o.Duration.Seconds())*respRequestsPerOp)
	args := []string{"-h", host, "-p", strconv.Itoa(o.BasePort + respPortOffset + li + 1), "-a", respTenantToken,
		"-t", "set,get", "-P", strconv.Itoa(respBenchPipeline), "-c", strconv.Itoa(respBenchClients),
		"-n", strconv.Itoa(n), "-r", strconv.Itoa(o.Keys), "-d", strconv.Itoa(o.ValueBytes), "--precision", "3"}
	rctx, cancel := context.WithTimeout(ctx, respBenchTimeoutMin+time.Duration(2*n)*20*time.Millisecond)
	defer cancel()
	cpu0, host0 := c.cpuSum(), readHostCPU()
	out, err := exec.CommandContext(rctx, bin, args...).CombinedOutput()
	cpu1, host1 := c.cpuSum(), readHostCPU()
	if err != nil {
		pr.Status, pr.Reason = "failed", fmt.Sprintf("redis-benchmark %s: %v: %s", strings.Join(args, " "), err, lastBytes(string(out), logTailBytes))
		return pr
	}
	tests, errs := parseRedisBenchmark(out)
	set, get := tests["SET"], tests["GET"]
	if set == nil || get == nil {
		pr.Status, pr.Reason = "failed", "redis-benchmark printed no SET and GET results: "+lastBytes(string(out), logTailBytes)
		return pr
	}
	ph := &PhaseResult{Scenario: "steady", Read: get.summary, Write: set.summary, ReadCurve: get.curve, WriteCurve: set.curve,
		Offered: set.requests + get.requests, Done: set.requests + get.requests, Errors: errs}
	ph.All = hist.Summary{Count: ph.Done, P50Us: max(set.summary.P50Us, get.summary.P50Us), P90Us: max(set.summary.P90Us, get.summary.P90Us),
		P99Us: max(set.summary.P99Us, get.summary.P99Us), P999Us: max(set.summary.P999Us, get.summary.P999Us), MaxUs: max(set.summary.MaxUs, get.summary.MaxUs)}
	ph.Victim = ph.All
	if secs := set.seconds + get.seconds; secs > 0 {
		ph.ThroughputOps = float64(ph.Done-errs) / secs
	}
	ph.HostStealPct = stealPct(host0, host1)
	if cpu1 > cpu0 {
		ph.CPUSeconds = cpu1 - cpu0
		if ok := ph.Done - errs; ok > 0 {
			ph.CPUPer1000 = ph.CPUSeconds / float64(ok) * 1000
		}
	}
	if errs > 0 {
		ph.ErrorKinds = map[string]int64{"redis-benchmark errors": errs}
	}
	pr.Phases["steady"] = ph
	pr.Status = "ok"
	return pr
}

// parseRedisBenchmark reads redis-benchmark's report (without -q or
// --csv): per test ("====== SET ======"), the request count and time, the
// percentile distribution, the throughput and the latency summary. P50,
// P99 and max come from the summary; P90 and P99.9 are the first listed
// percentile at or above them (an upper bound: the distribution halves
// its steps). errs counts "Error from server" lines.
func parseRedisBenchmark(out []byte) (tests map[string]*respBenchResult, errs int64) {
	tests = map[string]*respBenchResult{}
	var cur *respBenchResult
	inDist, inSummary := false, false
	// Progress lines end in '\r', not '\n'.
	sc := bufio.NewScanner(bytes.NewReader(bytes.ReplaceAll(out, []byte{'\r'}, []byte{'\n'})))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	ms := func(s string) int64 {
		v, _ := strconv.ParseFloat(s, 64)
		return int64(v * 1000)
	}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		f := strings.Fields(line)
		switch {
		case strings.Contains(line, "Error from server"):
			errs++
		case strings.HasPrefix(line, "======") && len(f) == 3:
			cur = &respBenchResult{}
			tests[f[1]] = cur
			inDist, inSummary = false, false
		case cur == nil:
		case len(f) >= 6 && f[1] == "requests" && f[2] == "completed":
			cur.requests, _ = strconv.ParseInt(f[0], 10, 64)
			cur.seconds, _ = strconv.ParseFloat(f[4], 64)
			cur.summary.Count = cur.requests
		case line == "Latency by percentile distribution:":
			inDist = true
		case line == "" || strings.HasPrefix(line, "Cumulative distribution"):
			inDist = false
		case inDist && len(f) >= 3 && strings.HasSuffix(f[0], "%") && f[1] == "<=":
			p, err := strconv.ParseFloat(strings.TrimSuffix(f[0], "%"), 64)
			if err != nil {
				continue
			}
			us := ms(f[2])
			cur.curve = append(cur.curve, hist.Point{Percentile: p, Us: us})
			if p >= 90 && cur.summary.P90Us == 0 {
				cur.summary.P90Us = us
			}
			if p >= 99.9 && cur.summary.P999Us == 0 {
				cur.summary.P999Us = us
			}
		case strings.HasPrefix(line, "throughput summary:") && len(f) >= 3:
			cur.rps, _ = strconv.ParseFloat(f[2], 64)
		case strings.HasPrefix(line, "avg") && strings.Contains(line, "p50"):
			inSummary = true
		case inSummary && len(f) == 6:
			cur.summary.MeanUs = float64(ms(f[0]))
			cur.summary.P50Us, cur.summary.P99Us, cur.summary.MaxUs = ms(f[2]), ms(f[4]), ms(f[5])
			if cur.summary.P999Us == 0 || cur.summary.P999Us > cur.summary.MaxUs {
				cur.summary.P999Us = cur.summary.MaxUs
			}
			inSummary = false
		}
	}
	return tests, errs
}
