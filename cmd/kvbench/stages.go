package main

// Where a request's time goes on the nodes, and the stalls: the stage
// histograms synod_write_stage_seconds and synod_read_stage_seconds
// (kv/replica/stages.go) and the counter synod_stage_stalls_total,
// scraped at both ends of a recorded window (nodestats.go), turned into
// P50/P99/P99.9 per stage; plus the stall traces the nodes wrote in the
// window (internal/stall; the nodes' [stall] table points them into
// --out, so they outlive the cluster's data).
//
// Percentiles come from the histograms' buckets (10 µs x 1.5^k): a
// quantile is interpolated within its bucket, so it is exact to the
// bucket's width (a factor 1.5) and no better; a quantile above the top
// finite bucket (~1.9 s) is reported as that bound with Over set.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Series kvbench reads for the stages.
const (
	metricWriteStage  = "synod_write_stage_seconds"
	metricReadStage   = "synod_read_stage_seconds"
	metricStalls      = "synod_stage_stalls_total"
	metricStallTraces = "synod_stall_traces_total"
)

// The stages in path order (kv/replica's WriteStages and ReadStages; a
// test holds them equal). followerStages are those a follower times
// itself: its half of the write path.
var (
	writeStageOrder = []string{"admission", "propose_queue", "ready", "persist", "accept_rtt", "commit", "apply_queue", "apply", "reply"}
	readStageOrder  = []string{"admission", "read_index", "apply_wait", "state_machine"}
	followerStages  = []string{"persist", "commit", "apply_queue", "apply"}
)

// StageFigures is one stage's latency over a window (ms).
type StageFigures struct {
	Stage  string  `json:"stage"`
	Count  int64   `json:"count"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	// MaxMs is the upper bound of the highest bucket that holds an
	// observation (the largest value is at most this).
	MaxMs float64 `json:"max_le_ms"`
	// Over: some quantile lies above the top finite bucket and is
	// reported as that bound.
	Over bool `json:"over_top_bucket,omitempty"`
}

// StageWindow is the stage figures and stalls of one recorded window.
type StageWindow struct {
	// Leader is the node (1-based) whose write and read stages are
	// reported: the one that proposed the most writes (0: none did).
	Leader int `json:"leader"`
	// Write and Read are the leader's stages in path order; Followers
	// merges the other nodes' followerStages.
	Write     []StageFigures `json:"write"`
	Read      []StageFigures `json:"read"`
	Followers []StageFigures `json:"followers"`
	// Stalls counts the stages past the nodes' stall threshold, summed
	// over every node, by "path/stage" (only those that stalled);
	// StallsTotal is their sum (-1: the nodes export no stall counter).
	Stalls      map[string]int64 `json:"stalls,omitempty"`
	StallsTotal int64            `json:"stalls_total"`
	// TracesWritten counts the trace files the nodes wrote over the
	// window; Traces names them (newest per node, as many as written).
	TracesWritten int64    `json:"traces_written"`
	Traces        []string `json:"traces,omitempty"`
}

// stageOf returns the figures of one stage by name (nil: absent).
func stageOf(fs []StageFigures, name string) *StageFigures {
	for i := range fs {
		if fs[i].Stage == name {
			return &fs[i]
		}
	}
	return nil
}

// seriesLabels splits a series key (`name` or `name{k="v",...}`, as the
// scrape keys it) into its name and labels.
func seriesLabels(series string) (string, map[string]string, error) {
	i := strings.IndexByte(series, '{')
	if i < 0 {
		return series, nil, nil
	}
	name, rest := series[:i], series[i+1:]
	if !strings.HasSuffix(rest, "}") {
		return "", nil, errors.New("unterminated label set")
	}
	rest = rest[:len(rest)-1]
	labels := map[string]string{}
	for len(rest) > 0 {
		eq := strings.IndexByte(rest, '=')
		if eq <= 0 || eq+1 >= len(rest) || rest[eq+1] != '"' {
			return "", nil, fmt.Errorf("bad label in %q", series)
		}
		key := strings.TrimSpace(rest[:eq])
		var val strings.Builder
		j := eq + 2
		for ; j < len(rest) && rest[j] != '"'; j++ {
			c := rest[j]
			if c == '\\' && j+1 < len(rest) {
				j++
				switch rest[j] {
				case 'n':
					c = '\n'
				default:
					c = rest[j]
				}
			}
			val.WriteByte(c)
		}
		if j >= len(rest) {
			return "", nil, fmt.Errorf("unterminated label value in %q", series)
		}
		labels[key] = val.String()
		rest = strings.TrimPrefix(rest[j+1:], ",")
	}
	return name, labels, nil
}

// bucket is one cumulative histogram bucket: count of values <= le.
type bucket struct {
	le float64
	n  float64
}

// stageBuckets returns the buckets of histogram name's child for stage in
// m, sorted by bound (+Inf last); nil when m lacks it.
func stageBuckets(m metrics, name, stage string) []bucket {
	return labeledBuckets(m, name, map[string]string{"stage": stage})
}

// labeledBuckets returns the buckets of histogram name's child whose
// labels include want, sorted by bound (+Inf last); nil when m lacks it.
func labeledBuckets(m metrics, name string, want map[string]string) []bucket {
	var out []bucket
	for series, v := range m {
		if !strings.HasPrefix(series, name+"_bucket{") {
			continue
		}
		n, labels, err := seriesLabels(series)
		if err != nil || n != name+"_bucket" {
			continue
		}
		match := true
		for k, w := range want {
			if labels[k] != w {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		le, err := strconv.ParseFloat(labels["le"], 64)
		if err != nil {
			continue
		}
		out = append(out, bucket{le: le, n: v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].le < out[j].le })
	return out
}

// deltaBuckets returns end's buckets minus start's, added into acc (same
// bounds; nil acc starts one). A node whose counts went back (a restart)
// or whose buckets differ is left out.
func deltaBuckets(acc []bucket, start, end []bucket) []bucket {
	if len(end) == 0 {
		return acc
	}
	if len(start) != 0 && len(start) != len(end) {
		return acc
	}
	d := make([]bucket, len(end))
	for i, b := range end {
		d[i] = b
		if len(start) > 0 {
			if start[i].le != b.le || b.n < start[i].n {
				return acc
			}
			d[i].n -= start[i].n
		}
	}
	if acc == nil {
		return d
	}
	if len(acc) != len(d) {
		return acc
	}
	for i := range acc {
		if acc[i].le != d[i].le {
			return acc
		}
		acc[i].n += d[i].n
	}
	return acc
}

// quantile interpolates quantile q of cumulative buckets bs (seconds),
// as PromQL's histogram_quantile does; over reports a quantile in the
// +Inf bucket (then the top finite bound is returned).
func quantile(bs []bucket, q float64) (v float64, over bool) {
	if len(bs) == 0 {
		return 0, false
	}
	total := bs[len(bs)-1].n
	if total <= 0 {
		return 0, false
	}
	rank := q * total
	prevLe, prevN := 0.0, 0.0
	for _, b := range bs {
		if b.n >= rank {
			if math.IsInf(b.le, 1) {
				return prevLe, true
			}
			if b.n == prevN {
				return b.le, false
			}
			return prevLe + (b.le-prevLe)*(rank-prevN)/(b.n-prevN), false
		}
		if !math.IsInf(b.le, 1) {
			prevLe = b.le
		}
		prevN = b.n
	}
	return prevLe, true
}

// figuresOf summarizes cumulative buckets bs of one stage.
func figuresOf(stage string, bs []bucket) StageFigures {
	f := StageFigures{Stage: stage}
	if len(bs) == 0 {
		return f
	}
	f.Count = int64(bs[len(bs)-1].n)
	for _, x := range []struct {
		q   float64
		dst *float64
	}{{0.5, &f.P50Ms}, {0.99, &f.P99Ms}, {0.999, &f.P999Ms}} {
		v, over := quantile(bs, x.q)
		*x.dst = v * 1000
		f.Over = f.Over || over
	}
	prevN := 0.0
	for _, b := range bs {
		if b.n > prevN {
			f.MaxMs = b.le * 1000
			if math.IsInf(b.le, 1) {
				f.MaxMs = math.Inf(1)
				f.Over = true
			}
		}
		prevN = b.n
	}
	if math.IsInf(f.MaxMs, 1) {
		f.MaxMs = -1 // JSON has no infinity: -1 is "above the top bucket"
	}
	return f
}

// stagesOf computes the stage window of a cluster from its scrapes at the
// window's ends (nil entries: a node that did not answer); traceDirs[k]
// is node k+1's stall trace directory ("" or missing: unknown).
func stagesOf(start, end []metrics, traceDirs []string) *StageWindow {
	at := func(ms []metrics, k int) metrics {
		if k < len(ms) {
			return ms[k]
		}
		return nil
	}
	sw := &StageWindow{StallsTotal: -1}
	// The leader: the node that proposed the most writes.
	best := 0.0
	for k := range end {
		var d []bucket
		d = deltaBuckets(d, stageBuckets(at(start, k), metricWriteStage, "propose_queue"), stageBuckets(at(end, k), metricWriteStage, "propose_queue"))
		if len(d) > 0 && d[len(d)-1].n > best {
			best, sw.Leader = d[len(d)-1].n, k+1
		}
	}
	if sw.Leader == 0 {
		return sw
	}
	k := sw.Leader - 1
	for _, st := range writeStageOrder {
		sw.Write = append(sw.Write, figuresOf(st, deltaBuckets(nil, stageBuckets(at(start, k), metricWriteStage, st), stageBuckets(at(end, k), metricWriteStage, st))))
	}
	for _, st := range readStageOrder {
		sw.Read = append(sw.Read, figuresOf(st, deltaBuckets(nil, stageBuckets(at(start, k), metricReadStage, st), stageBuckets(at(end, k), metricReadStage, st))))
	}
	for _, st := range followerStages {
		var acc []bucket
		for j := range end {
			if j != k {
				acc = deltaBuckets(acc, stageBuckets(at(start, j), metricWriteStage, st), stageBuckets(at(end, j), metricWriteStage, st))
			}
		}
		sw.Followers = append(sw.Followers, figuresOf(st, acc))
	}
	for j := range end {
		s, e := at(start, j), at(end, j)
		if s == nil || e == nil {
			continue
		}
		for series, v := range e {
			if !strings.HasPrefix(series, metricStalls+"{") {
				continue
			}
			_, labels, err := seriesLabels(series)
			if err != nil {
				continue
			}
			if sw.StallsTotal < 0 {
				sw.StallsTotal = 0
			}
			if d := v - s[series]; d > 0 {
				if sw.Stalls == nil {
					sw.Stalls = map[string]int64{}
				}
				sw.Stalls[labels["path"]+"/"+labels["stage"]] += int64(d)
				sw.StallsTotal += int64(d)
			}
		}
		written := fmt.Sprintf("%s{result=%q}", metricStallTraces, "written")
		a, okA := s.get(written)
		b, okB := e.get(written)
		if !okA || !okB || b <= a {
			continue
		}
		sw.TracesWritten += int64(b - a)
		if j < len(traceDirs) && traceDirs[j] != "" {
			sw.Traces = append(sw.Traces, newestTraces(traceDirs[j], int(b-a))...)
		}
	}
	return sw
}

// newestTraces lists the n newest stall trace files in dir (trace names
// sort by the time of their stall).
func newestTraces(dir string, n int) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "stall-") && strings.HasSuffix(e.Name(), ".trace") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	if len(names) > n {
		names = names[len(names)-n:]
	}
	for i, nm := range names {
		names[i] = filepath.Join(dir, nm)
	}
	return names
}

// Stall settings of the embedded clusters' nodes ([stall] in their
// config): traces go under --out, at most one per stallTraceEvery per
// node, so a phase of a few seconds can hold several.
const (
	stallTraceEvery    = 2 * time.Second
	stallTraceFilesMax = 32
	stallTraceBytesMax = 512 << 20
)

// StallOptions are kvbench's stall detector knobs (embedded in Options).
type StallOptions struct {
	// StallThreshold is the nodes' [stall] threshold (0: kvnode's
	// default, 20 ms).
	StallThreshold time.Duration `json:"stall_threshold"`
	// StallTrace runs the nodes' flight recorder, so stalls come with
	// traces. Off by default, as in kvnode: the recorder's own cost shows
	// in the tail (docs/benchmarking.md, "What the flight recorder costs
	// the tail"); stalls are counted either way.
	StallTrace bool `json:"stall_trace"`
}

// stallDirs remembers each path's trace directory root (set when its
// node configs are rendered; read when its windows close).
var stallDirs sync.Map // path name -> string

// stallTraceDir is node i's trace directory on path p.
func stallTraceDir(o *Options, p Path, i int) string {
	root := filepath.Join(o.OutDir, "stalls", p.Name)
	stallDirs.Store(p.Name, root)
	abs, err := filepath.Abs(filepath.Join(root, fmt.Sprintf("node%d", i)))
	if err != nil {
		return filepath.Join(root, fmt.Sprintf("node%d", i))
	}
	return abs
}

// stallConfig renders node i's [stall] table (the raft path has no
// stage histograms; kvnode ignores nothing, so it gets the table too).
func stallConfig(o *Options, p Path, i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n[stall]\n")
	if o.StallThreshold > 0 {
		fmt.Fprintf(&b, "threshold = %q\n", o.StallThreshold.String())
	}
	fmt.Fprintf(&b, "trace = %v\ntrace_dir = %q\ntrace_every = %q\ntrace_files_max = %d\ntrace_bytes_max = %d\n\n",
		o.StallTrace, stallTraceDir(o, p, i), stallTraceEvery.String(), stallTraceFilesMax, stallTraceBytesMax)
	return b.String()
}

// traceDirsOf lists the trace directories of c's nodes (nil: unknown).
func traceDirsOf(c *cluster) []string {
	v, ok := stallDirs.Load(c.path.Name)
	if !ok {
		return nil
	}
	root := v.(string)
	out := make([]string, len(c.admins))
	for i := range out {
		if abs, err := filepath.Abs(filepath.Join(root, fmt.Sprintf("node%d", i+1))); err == nil {
			out[i] = abs
		}
	}
	return out
}

// phaseStages returns a phase's stage window (nil: none measured).
func phaseStages(ph *PhaseResult) *StageWindow {
	if ph == nil || ph.Cluster == nil {
		return nil
	}
	return ph.Cluster.Stages
}

// stagesReportScenarios are the scenarios whose stages the table shows.
var stagesReportScenarios = []string{scenSteady, scenTail}

// writeStageDetail prints, for the steady and tail scenarios, each
// stage's P50/P99/P99.9 per path (the leader's write and read stages,
// the followers' half), the stalls by stage and where their traces are.
func writeStageDetail(w io.Writer, r *Report) {
	for _, s := range stagesReportScenarios {
		any := false
		for _, p := range r.Paths {
			if phaseStages(p.Phases[s]) != nil {
				any = true
			}
		}
		if !any {
			continue
		}
		fmt.Fprintf(w, "\nstages, %s scenario: ms P50 / P99 / P99.9 per stage (the leader's write and read paths, then the followers'); from the nodes' histograms, exact to a bucket (x1.5)\n", s)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "stage\t")
		for _, p := range r.Paths {
			fmt.Fprintf(tw, "%s\t", p.Name)
		}
		fmt.Fprintln(tw)
		cell := func(f *StageFigures) string {
			if f == nil || f.Count == 0 {
				return "-"
			}
			c := fmt.Sprintf("%s/%s/%s", msf(f.P50Ms), msf(f.P99Ms), msf(f.P999Ms))
			if f.Over {
				c += "+"
			}
			return c
		}
		row := func(name string, get func(sw *StageWindow) string) {
			fmt.Fprintf(tw, "%s\t", name)
			for _, p := range r.Paths {
				sw := phaseStages(p.Phases[s])
				if sw == nil || sw.Leader == 0 {
					fmt.Fprintf(tw, "-\t")
					continue
				}
				fmt.Fprintf(tw, "%s\t", get(sw))
			}
			fmt.Fprintln(tw)
		}
		for _, st := range writeStageOrder {
			row("write "+st, func(sw *StageWindow) string { return cell(stageOf(sw.Write, st)) })
		}
		for _, st := range readStageOrder {
			row("read "+st, func(sw *StageWindow) string { return cell(stageOf(sw.Read, st)) })
		}
		for _, st := range followerStages {
			row("follower "+st, func(sw *StageWindow) string { return cell(stageOf(sw.Followers, st)) })
		}
		row("stalls", func(sw *StageWindow) string {
			if sw.StallsTotal < 0 {
				return "?"
			}
			return fmt.Sprint(sw.StallsTotal)
		})
		row("stall traces", func(sw *StageWindow) string { return fmt.Sprint(sw.TracesWritten) })
		tw.Flush()
		for _, p := range r.Paths {
			sw := phaseStages(p.Phases[s])
			if sw == nil || sw.StallsTotal <= 0 {
				continue
			}
			var by []string
			for k, n := range sw.Stalls {
				by = append(by, fmt.Sprintf("%s %d", k, n))
			}
			sort.Strings(by)
			fmt.Fprintf(w, "  %s: stalls %s", p.Name, strings.Join(by, ", "))
			if len(sw.Traces) > 0 {
				fmt.Fprintf(w, "; traces in %s (`kvbench stalls FILE` summarizes one)", filepath.Dir(filepath.Dir(sw.Traces[0])))
			}
			fmt.Fprintln(w)
		}
	}
}

// msf formats milliseconds with 2 significant decimals below 10 ms.
func msf(v float64) string {
	switch {
	case v < 0.1:
		return fmt.Sprintf("%.3f", v)
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// stallFlags are the flags of StallOptions.
type stallFlags struct {
	threshold time.Duration
	trace     bool
}

// addStallFlags registers --stall-threshold and --stall-trace on fs.
func addStallFlags(fs *flag.FlagSet) *stallFlags {
	f := &stallFlags{}
	fs.DurationVar(&f.threshold, "stall-threshold", 0, "the nodes' stall threshold ([stall] threshold; 0: kvnode's default, 20ms)")
	fs.BoolVar(&f.trace, "stall-trace", false, "run the nodes' flight recorder, so each stall comes with a trace under --out/stalls (off, as in kvnode: it costs the tail)")
	return f
}

// apply sets o's stall options from the parsed flags.
func (f *stallFlags) apply(o *Options) {
	o.StallThreshold = f.threshold
	o.StallTrace = f.trace
}
