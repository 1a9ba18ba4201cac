package main

// `kvbench stalls FILE|DIR...`: what each stall in a node's stall trace
// was. A trace (internal/stall) holds the last seconds of the node's Go
// execution trace and, for every stall seen in them, a mark (a trace.Log
// event of category synod.stall, "path=... stage=... took=... slot=...")
// at the moment the stalled stage ended; the stall's window is [mark -
// took, mark]. For each window this prints where the node's loops spent
// it (running and where it stopped running, runnable = waiting for a
// CPU slot of the Go scheduler, in a syscall, blocked and on what), what
// the garbage collector did
// (stop-the-world pauses, the share of the window its mark phase ran,
// mark assists), whether Pebble flushed or compacted and whether a
// snapshot ran, and a one-line verdict.
//
// The events come from `go tool trace -d=parsed` (the toolchain's own
// parser, streamed: a trace is never held whole); its text is read with
// bounded lines and events, and a trace that does not parse is an error
// for that file only.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Limits of the analysis.
const (
	// stallLineBytesMax bounds one line of the parsed dump.
	stallLineBytesMax = 1 << 20
	// stallEventsMax bounds the events read from one trace (a flight
	// recorder window of 32 MiB holds a few million).
	stallEventsMax = 50_000_000
	// stallIntervalsMax bounds the goroutine state intervals kept.
	stallIntervalsMax = 20_000_000
	// stallTraceTimeout bounds the analysis of one trace.
	stallTraceTimeout = 10 * time.Minute
)

// stallsMain analyzes the traces named by args (files, or directories of
// stall-*.trace files) and prints one report per stall.
func stallsMain(args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: kvbench stalls FILE|DIR... (stall traces written by kvnode's [stall] detector)")
	}
	var files []string
	for _, a := range args {
		st, err := os.Stat(a)
		if err != nil {
			return err
		}
		if !st.IsDir() {
			files = append(files, a)
			continue
		}
		err = filepath.WalkDir(a, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), "stall-") && strings.HasSuffix(d.Name(), ".trace") {
				files = append(files, p)
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	sort.Strings(files)
	failed := 0
	var sum causeSummary
	var reps []*traceReport
	for _, f := range files {
		rep, err := analyzeTraceFile(f)
		if err != nil {
			fmt.Fprintf(out, "%s: %v\n", f, err)
			failed++
			continue
		}
		reps = append(reps, rep)
	}
	addPeers(reps) // stalltrace_peers.go
	for _, rep := range reps {
		rep.write(out)
		sum.add(rep)
	}
	sum.write(out)
	if failed > 0 {
		return fmt.Errorf("%d of %d traces could not be analyzed", failed, len(files))
	}
	return nil
}

// analyzeTraceFile runs the toolchain's parser over file and analyzes its
// output.
func analyzeTraceFile(file string) (*traceReport, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("the go command is needed to parse traces: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), stallTraceTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "tool", "trace", "-d=parsed", file)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &limitedBuilder{b: &stderr, left: 4096}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	rep, perr := analyzeParsed(stdout)
	io.Copy(io.Discard, stdout)
	werr := cmd.Wait()
	if perr != nil {
		return nil, perr
	}
	if werr != nil {
		return nil, fmt.Errorf("go tool trace: %v: %s", werr, strings.TrimSpace(stderr.String()))
	}
	rep.file = file
	return rep, nil
}

// limitedBuilder keeps the first left bytes written to it.
type limitedBuilder struct {
	b    *strings.Builder
	left int
}

func (l *limitedBuilder) Write(p []byte) (int, error) {
	if l.left > 0 {
		n := min(len(p), l.left)
		l.b.Write(p[:n])
		l.left -= n
	}
	return len(p), nil
}

// Goroutine roles, known from the functions on their stacks.
const (
	roleOther = iota
	roleConsensus
	roleApply
	roleReceive
	roleSend
	roleSide
	rolePebbleFlush
	rolePebbleCompact
	roleSnapshot
	roleGC
	roleClient    // the server's request goroutines and connections
	roleStall     // the stall detector's own snapshot writer
	rolePersister // the leader's own persists (kv/replica persister.go)
	rolesN
)

var roleNames = [rolesN]string{"other", "consensus loop", "apply loop", "receive loop", "send loop", "side channel",
	"pebble flush", "pebble compaction", "snapshot", "GC worker", "client requests", "stall writer", "persister"}

// roleFrames map a frame (substring of a function name) to a role; the
// first match on a stack, in this order, wins.
var roleFrames = []struct {
	frame string
	role  int
}{
	{"(*Replica).consensusLoop", roleConsensus},
	{"(*Replica).applyLoop", roleApply},
	{"(*Replica).receiveLoop", roleReceive},
	{"(*Replica).sendLoop", roleSend},
	{"(*sideChannel)", roleSide},
	{"pebble/v2.(*DB).flush", rolePebbleFlush},
	{"pebble/v2.(*DB).compact", rolePebbleCompact},
	{"runtime.gcBgMarkWorker", roleGC},
	{"kv/server.(*conn)", roleClient},
	{"internal/stall.(*Detector).snapshot", roleStall},
	{"(*Replica).persistLoop", rolePersister},
}

// Goroutine states as the parser names them.
const (
	stRunning = iota
	stRunnable
	stSyscall
	stWaiting
	stOther
	statesN
)

func stateOf(s string) int {
	switch s {
	case "Running":
		return stRunning
	case "Runnable":
		return stRunnable
	case "Syscall":
		return stSyscall
	case "Waiting":
		return stWaiting
	}
	return stOther
}

var stateNames = [statesN]string{"running", "runnable", "syscall", "blocked", "other"}

// interval is a goroutine's time in one state.
type interval struct {
	g          int64
	start, end int64
	state      uint8
	why        int32 // index into strs: where it entered the state (frame, reason)
	// snap: a stack of the goroutine inside the state machine's snapshot
	// code was seen during the interval (entering it, leaving it, or an
	// event within it).
	snap bool
}

// rangeEv is a runtime range (GC mark phase, a stop-the-world, an assist).
type rangeEv struct {
	name       string
	g          int64 // goroutine scope (0: global)
	start, end int64
}

// stallMark is one stall's mark in the trace.
type stallMark struct {
	at   int64
	msg  string
	took time.Duration
}

// traceParse is what one pass over the parsed dump collects.
type traceParse struct {
	strs    []string
	strIdx  map[string]int32
	ivs     []interval
	ranges  []rangeEv
	marks   []stallMark
	roles   map[int64]int
	snap    map[int64]bool // goroutines ever seen inside a state-machine snapshot (the planted rule only)
	state   map[int64]goState
	open    map[string]rangeEv // key: name + scope
	first   int64
	last    int64
	dropped int // intervals beyond stallIntervalsMax
	// wallOff turns trace time into wall-clock time (Unix ns) from the
	// trace's first Sync event; hasWall says there was one.
	wallOff int64
	hasWall bool
}

type goState struct {
	state int
	since int64
	why   int32
	snap  bool // a stack inside snapshot code seen since it entered the state
}

func (tp *traceParse) str(s string) int32 {
	if i, ok := tp.strIdx[s]; ok {
		return i
	}
	i := int32(len(tp.strs))
	tp.strs = append(tp.strs, s)
	tp.strIdx[s] = i
	return i
}

var (
	reHead  = regexp.MustCompile(`^M=(-?\d+) P=(-?\d+) G=(-?\d+) (\w+) Time=(\d+)(.*)$`)
	reTrans = regexp.MustCompile(`GoID=(\d+) (\w+)->(\w+) Reason="([^"]*)"`)
	reName  = regexp.MustCompile(`Name="([^"]*)"`)
	reScope = regexp.MustCompile(`Scope=Goroutine\((\d+)\)`)
	reLog   = regexp.MustCompile(`Category="synod\.stall" Message="([^"]*)"`)
	reTook  = regexp.MustCompile(`took=(\S+)`)
	reStage = regexp.MustCompile(`stage=(\S+)`)
	reWall  = regexp.MustCompile(`Wall=(\S+)`)
)

// event is one parsed event with its stacks' function names.
type event struct {
	g, t     int64
	kind     string
	rest     string
	stack    []string // Stack=
	trans    []string // TransitionStack=
	inTrans  bool
	hasStack bool
}

// analyzeParsed reads `go tool trace -d=parsed` output.
func analyzeParsed(r io.Reader) (*traceReport, error) {
	tp := &traceParse{strIdx: map[string]int32{}, roles: map[int64]int{}, snap: map[int64]bool{},
		state: map[int64]goState{}, open: map[string]rangeEv{}, first: -1}
	tp.str("")
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), stallLineBytesMax)
	var ev *event
	events := 0
	flush := func() {
		if ev != nil {
			tp.event(ev)
			ev = nil
		}
	}
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "M=") {
			flush()
			m := reHead.FindStringSubmatch(line)
			if m == nil {
				continue // Sync and other events without a time we need
			}
			events++
			if events > stallEventsMax {
				return nil, fmt.Errorf("more than %d events", stallEventsMax)
			}
			g, _ := strconv.ParseInt(m[3], 10, 64)
			t, _ := strconv.ParseInt(m[5], 10, 64)
			ev = &event{g: g, t: t, kind: m[4], rest: m[6]}
			continue
		}
		if ev == nil {
			continue
		}
		switch {
		case line == "Stack=":
			ev.inTrans, ev.hasStack = false, true
		case line == "TransitionStack=":
			ev.inTrans = true
		case strings.HasPrefix(line, "\t") && strings.Contains(line, " @ 0x"):
			fn := strings.TrimSpace(line[:strings.Index(line, " @ 0x")])
			if ev.inTrans {
				ev.trans = append(ev.trans, fn)
			} else {
				ev.stack = append(ev.stack, fn)
			}
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if events == 0 {
		return nil, errors.New("no events (not an execution trace?)")
	}
	tp.finish()
	return tp.report(), nil
}

// summary names where a stack is: the first frame outside the runtime
// and the standard library's plumbing.
func summary(stack []string) string {
	for _, f := range stack {
		if strings.HasPrefix(f, "runtime.") || strings.HasPrefix(f, "syscall.") || strings.HasPrefix(f, "internal/") ||
			strings.HasPrefix(f, "sync.") || strings.HasPrefix(f, "time.") || strings.HasPrefix(f, "golang.org/x/sys/unix.") ||
			strings.HasPrefix(f, "os.") || strings.HasPrefix(f, "net.") {
			continue
		}
		return shortFn(f)
	}
	if len(stack) > 0 {
		return shortFn(stack[0])
	}
	return ""
}

// shortFn drops the module path of a function name.
func shortFn(f string) string {
	for _, p := range []string{"github.com/cockroachdb/", "synod/"} {
		f = strings.TrimPrefix(f, p)
	}
	return f
}

// roleOfStack returns the role a stack shows (roleOther: none).
func roleOfStack(stack []string) int {
	for _, rf := range roleFrames {
		for _, f := range stack {
			if strings.Contains(f, rf.frame) {
				return rf.role
			}
		}
	}
	return roleOther
}

// inSnapshot reports a stack inside the state machine's snapshot code.
func inSnapshot(stack []string) bool {
	for _, f := range stack {
		if strings.Contains(f, "(*Replica).snapshot") || strings.Contains(f, "kv/sm.(*SM).Snapshot") || strings.Contains(f, "kv/sm.(*SM).Flush") {
			return true
		}
	}
	return false
}

func (tp *traceParse) note(g int64, stack []string) {
	if g <= 0 || len(stack) == 0 {
		return
	}
	if r := roleOfStack(stack); r != roleOther {
		if old := tp.roles[g]; old == roleOther || r < old {
			tp.roles[g] = r
		}
	}
	if inSnapshot(stack) {
		tp.snap[g] = true
		if st, ok := tp.state[g]; ok {
			st.snap = true
			tp.state[g] = st
		}
	}
}

// testingSnapshotByGoroutine plants the rule the per-interval mark
// replaced: a goroutine once seen in snapshot code counts as running a
// snapshot in every window where it runs (the apply loop, which starts
// every snapshot, then looked like it ran one in every episode).
var testingSnapshotByGoroutine bool

func (tp *traceParse) event(ev *event) {
	if tp.first < 0 || ev.t < tp.first {
		tp.first = ev.t
	}
	tp.last = max(tp.last, ev.t)
	tp.note(ev.g, ev.stack)
	switch ev.kind {
	case "StateTransition":
		m := reTrans.FindStringSubmatch(ev.rest)
		if m == nil {
			return // a proc transition
		}
		g, _ := strconv.ParseInt(m[1], 10, 64)
		tp.note(g, ev.trans)
		from, to := stateOf(m[2]), stateOf(m[3])
		if old, ok := tp.state[g]; ok && old.state != stOther {
			why := old.why
			if old.state == stRunning && len(ev.trans) > 0 {
				// Where it stopped running (preempted, blocking, a
				// syscall): without a CPU profile in the trace, the
				// one sample of what it ran.
				why = tp.str("until " + summary(ev.trans))
			}
			// old.snap holds the stack it entered with and any seen
			// since, the transition's stack included (note, above).
			tp.add(interval{g: g, start: old.since, end: ev.t, state: uint8(old.state), why: why, snap: old.snap})
		} else if !ok && from != stOther && tp.first >= 0 {
			// First sight: it was in from since the trace began.
			tp.add(interval{g: g, start: tp.first, end: ev.t, state: uint8(from)})
		}
		why := ""
		switch to {
		case stWaiting:
			why = m[4] + " at " + summary(ev.trans)
		case stSyscall:
			why = summary(ev.trans)
		case stRunnable:
			why = m[4]
		}
		// The stack it leaves the old state with is the one it enters the
		// new one with.
		tp.state[g] = goState{state: to, since: ev.t, why: tp.str(why), snap: inSnapshot(ev.trans)}
	case "Sync":
		if m := reWall.FindStringSubmatch(ev.rest); m != nil && !tp.hasWall {
			if w, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
				tp.wallOff, tp.hasWall = w.UnixNano()-ev.t, true
			}
		}
	case "RangeBegin":
		name, g := rangeOf(ev.rest)
		tp.open[fmt.Sprint(name, g)] = rangeEv{name: name, g: g, start: ev.t}
	case "RangeEnd":
		name, g := rangeOf(ev.rest)
		key := fmt.Sprint(name, g)
		r, ok := tp.open[key]
		if !ok {
			r = rangeEv{name: name, g: g, start: tp.first}
		}
		delete(tp.open, key)
		r.end = ev.t
		tp.ranges = append(tp.ranges, r)
	case "Log":
		if m := reLog.FindStringSubmatch(ev.rest); m != nil {
			mk := stallMark{at: ev.t, msg: m[1]}
			if t := reTook.FindStringSubmatch(m[1]); t != nil {
				mk.took, _ = time.ParseDuration(t[1])
			}
			tp.marks = append(tp.marks, mk)
		}
	}
}

func rangeOf(rest string) (string, int64) {
	name := ""
	if m := reName.FindStringSubmatch(rest); m != nil {
		name = m[1]
	}
	var g int64
	if m := reScope.FindStringSubmatch(rest); m != nil {
		g, _ = strconv.ParseInt(m[1], 10, 64)
	}
	return name, g
}

func (tp *traceParse) add(iv interval) {
	if iv.end <= iv.start {
		return
	}
	if len(tp.ivs) >= stallIntervalsMax {
		tp.dropped++
		return
	}
	tp.ivs = append(tp.ivs, iv)
}

// finish closes what is still open at the trace's end.
func (tp *traceParse) finish() {
	for g, s := range tp.state {
		if s.state != stOther {
			tp.add(interval{g: g, start: s.since, end: tp.last, state: uint8(s.state), why: s.why, snap: s.snap})
		}
	}
	for _, r := range tp.open {
		r.end = tp.last
		tp.ranges = append(tp.ranges, r)
	}
}

// roleTime is how a role's goroutines spent a window.
type roleTime struct {
	byState [statesN]time.Duration
	why     [statesN]map[string]time.Duration
}

func (rt *roleTime) topWhy(st int) (string, time.Duration) {
	best, bd := "", time.Duration(0)
	for w, d := range rt.why[st] {
		if d > bd || d == bd && w < best {
			best, bd = w, d
		}
	}
	return best, bd
}

// stallReport is the analysis of one episode: stall windows that overlap
// (one cause usually stalls many requests, in several stages) merged.
type stallReport struct {
	marks    []stallMark
	stages   map[string]int // stalls by stage
	longest  stallMark
	from, to int64         // the episode's window, trace clock (ns)
	clipped  bool          // it starts before the trace
	into     time.Duration // its end from the trace's start
	roles    [rolesN]*roleTime
	gcMark   time.Duration
	stw      time.Duration
	stwCount int
	stwMax   time.Duration
	assists  map[int]time.Duration // by role
	// snapshotOn: a goroutine inside the state machine's snapshot code
	// ran (or sat in a syscall) in the window.
	snapshotOn bool
	verdict    string
	// cause is the verdict's first finding as a short class (the
	// summary's key): "GC stop-the-world", "snapshot", "<loop> waiting
	// for a CPU", "<loop> in msync", "<loop> busy", "<loop> idle", ...
	cause string
	// peers: the other nodes' loops in the same wall-clock window
	// (stalltrace_peers.go).
	peers []*peerView
}

// traceReport is one file's analysis.
type traceReport struct {
	file     string
	span     time.Duration
	marks    int
	stalls   []*stallReport
	dropped  int
	goCounts [rolesN]int
	// The loops' state intervals and the trace's wall-clock span, so the
	// other nodes' episodes can be seen from here (stalltrace_peers.go).
	loops         []loopInterval
	wallOff       int64
	hasWall       bool
	firstT, lastT int64
}

func overlap(a0, a1, b0, b1 int64) time.Duration {
	lo, hi := max(a0, b0), min(a1, b1)
	if hi <= lo {
		return 0
	}
	return time.Duration(hi - lo)
}

// episodes merges the marks' windows [at - took, at] that overlap.
func (tp *traceParse) episodes() []*stallReport {
	ms := append([]stallMark(nil), tp.marks...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].at-int64(ms[i].took) < ms[j].at-int64(ms[j].took) })
	var out []*stallReport
	for _, mk := range ms {
		from := mk.at - int64(mk.took)
		var sr *stallReport
		if n := len(out); n > 0 && from <= out[n-1].to {
			sr = out[n-1]
		} else {
			sr = &stallReport{from: from, to: mk.at, stages: map[string]int{}, assists: map[int]time.Duration{}}
			out = append(out, sr)
		}
		sr.to = max(sr.to, mk.at)
		sr.marks = append(sr.marks, mk)
		if m := reStage.FindStringSubmatch(mk.msg); m != nil {
			sr.stages[m[1]]++
		}
		if mk.took > sr.longest.took {
			sr.longest = mk
		}
	}
	return out
}

func (tp *traceParse) report() *traceReport {
	rep := &traceReport{span: time.Duration(tp.last - tp.first), dropped: tp.dropped, marks: len(tp.marks),
		wallOff: tp.wallOff, hasWall: tp.hasWall, firstT: tp.first, lastT: tp.last}
	for _, r := range tp.roles {
		rep.goCounts[r]++
	}
	rep.loops = tp.loopIntervals() // stalltrace_peers.go
	for _, sr := range tp.episodes() {
		if sr.from < tp.first {
			sr.from, sr.clipped = tp.first, true
		}
		sr.into = time.Duration(sr.to - tp.first)
		for i := range sr.roles {
			sr.roles[i] = &roleTime{}
			for s := range sr.roles[i].why {
				sr.roles[i].why[s] = map[string]time.Duration{}
			}
		}
		for _, iv := range tp.ivs {
			d := overlap(iv.start, iv.end, sr.from, sr.to)
			if d == 0 {
				continue
			}
			rt := sr.roles[tp.roles[iv.g]]
			rt.byState[iv.state] += d
			rt.why[iv.state][tp.strs[iv.why]] += d
			snap := iv.snap
			if testingSnapshotByGoroutine {
				snap = tp.snap[iv.g]
			}
			if snap && (iv.state == stRunning || iv.state == stSyscall) {
				sr.snapshotOn = true
			}
		}
		for _, r := range tp.ranges {
			d := overlap(r.start, r.end, sr.from, sr.to)
			if d == 0 {
				continue
			}
			switch {
			case r.name == "GC concurrent mark phase":
				sr.gcMark += d
			case strings.HasPrefix(r.name, "stop-the-world"):
				sr.stw += d
				sr.stwCount++
				sr.stwMax = max(sr.stwMax, time.Duration(r.end-r.start))
			case r.name == "GC mark assist":
				sr.assists[tp.roles[r.g]] += d
			}
		}
		sr.verdict, sr.cause = sr.judge()
		rep.stalls = append(rep.stalls, sr)
	}
	return rep
}

// loopOf is the loop a stage runs on (roleClient: the request's own
// goroutine). A persist runs on the consensus loop, or for the leader's
// own acceptances on the persister: the busier of the two in the window.
func (sr *stallReport) loopOf(stage string) int {
	switch stage {
	case "persist":
		busy := func(r int) time.Duration {
			b := sr.roles[r].byState
			return b[stRunning] + b[stRunnable] + b[stSyscall]
		}
		if busy(rolePersister) > busy(roleConsensus) {
			return rolePersister
		}
		return roleConsensus
	case "propose_queue", "ready", "accept_rtt", "commit", "read_index":
		return roleConsensus
	case "apply_queue", "apply", "apply_wait":
		return roleApply
	}
	return roleClient
}

// judge names the most likely cause of a stall from its window: the
// verdict lists every finding, cause classes the first one.
func (sr *stallReport) judge() (verdict, cause string) {
	win := time.Duration(sr.to - sr.from)
	if win <= 0 {
		return "window outside the trace", "outside the trace"
	}
	stage := ""
	if m := reStage.FindStringSubmatch(sr.longest.msg); m != nil {
		stage = m[1]
	}
	frac := func(d time.Duration) float64 { return float64(d) / float64(win) }
	var parts, causes []string
	if sr.stwMax >= win/4 || sr.stw >= win/3 {
		parts = append(parts, fmt.Sprintf("GC stop-the-world (%v, longest %v)", sr.stw.Round(time.Microsecond), sr.stwMax.Round(time.Microsecond)))
		causes = append(causes, "GC stop-the-world")
	}
	role := sr.loopOf(stage)
	loop := sr.roles[role]
	if sr.snapshotOn {
		parts = append(parts, "a snapshot ran on the apply loop")
		causes = append(causes, "snapshot")
	}
	if stage != "" {
		// The stalled loop's dominant state.
		st, best := 0, time.Duration(0)
		for s := 0; s < stOther; s++ {
			if loop.byState[s] > best {
				st, best = s, loop.byState[s]
			}
		}
		if best > 0 {
			why, _ := loop.topWhy(st)
			name := roleNames[role]
			desc := fmt.Sprintf("%s %s %.0f%%", name, stateNames[st], 100*frac(best))
			if frac(best) > 1 {
				// A role of many goroutines (client requests): their
				// times add up beyond the window.
				desc = fmt.Sprintf("%s %s %v summed over its goroutines", name, stateNames[st], best.Round(time.Millisecond))
			}
			if why != "" {
				desc += " (" + why + ")"
			}
			class := name + " " + stateNames[st]
			switch {
			case st == stWaiting && strings.Contains(why, "select at kv/replica.(*Replica).consensusLoop"):
				desc += ": idle, so the stage waited on the network or the other nodes"
				class = name + " idle (waiting on the network or the other nodes)"
			case st == stSyscall && strings.Contains(why, "pmem."):
				class = name + " in msync (acceptor log persist)"
			case st == stSyscall:
				class = name + " in a syscall (" + why + ")"
			case st == stRunning:
				class = name + " busy on the CPU"
			case st == stRunnable:
				class = name + " waiting for a CPU (scheduler)"
			case st == stWaiting:
				class = name + " blocked (" + strings.SplitN(why, " at ", 2)[0] + ")"
			}
			parts = append(parts, desc)
			causes = append(causes, class)
			if st == stRunnable {
				parts = append(parts, "scheduler: the loop waited for a CPU")
			}
		}
	}
	if a := sr.assists[role]; a >= win/10 {
		parts = append(parts, fmt.Sprintf("GC mark assists on the loop %v", a.Round(time.Microsecond)))
		causes = append(causes, "GC mark assists")
	}
	if sr.gcMark >= win/2 {
		parts = append(parts, fmt.Sprintf("GC marking %.0f%% of the window", 100*frac(sr.gcMark)))
		causes = append(causes, "GC marking")
	}
	fl := sr.roles[rolePebbleFlush].byState[stRunning] + sr.roles[rolePebbleFlush].byState[stSyscall]
	co := sr.roles[rolePebbleCompact].byState[stRunning] + sr.roles[rolePebbleCompact].byState[stSyscall]
	if fl >= win/10 {
		parts = append(parts, fmt.Sprintf("pebble flush busy %v", fl.Round(time.Microsecond)))
		causes = append(causes, "pebble flush")
	}
	if co >= win/10 {
		parts = append(parts, fmt.Sprintf("pebble compaction busy %v", co.Round(time.Microsecond)))
		causes = append(causes, "pebble compaction")
	}
	if len(parts) == 0 {
		return "no cause visible in this process (another node, or the OS descheduled it)", "no cause visible in this process"
	}
	return strings.Join(parts, "; "), causes[0]
}

// write prints the report.
func (rep *traceReport) write(w io.Writer) {
	fmt.Fprintf(w, "%s: %v of trace, %d stall mark(s) in %d episode(s)\n", rep.file, rep.span.Round(time.Millisecond), rep.marks, len(rep.stalls))
	if rep.dropped > 0 {
		fmt.Fprintf(w, "  (%d goroutine intervals beyond the analysis limit were left out)\n", rep.dropped)
	}
	for _, sr := range rep.stalls {
		win := time.Duration(sr.to - sr.from)
		var by []string
		for st, n := range sr.stages {
			by = append(by, fmt.Sprintf("%s %d", st, n))
		}
		sort.Strings(by)
		fmt.Fprintf(w, "  episode %v ending %v into the trace: %d stall(s) [%s]; longest %s", win.Round(time.Microsecond),
			sr.into.Round(time.Millisecond), len(sr.marks), strings.Join(by, ", "), sr.longest.msg)
		if sr.clipped {
			fmt.Fprintf(w, " (clipped: it began before the trace)")
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "    GC: mark phase %v, stop-the-world %v in %d (longest %v)", sr.gcMark.Round(time.Microsecond),
			sr.stw.Round(time.Microsecond), sr.stwCount, sr.stwMax.Round(time.Microsecond))
		var as []string
		for r, d := range sr.assists {
			as = append(as, fmt.Sprintf("%s %v", roleNames[r], d.Round(time.Microsecond)))
		}
		sort.Strings(as)
		if len(as) > 0 {
			fmt.Fprintf(w, "; assists: %s", strings.Join(as, ", "))
		}
		fmt.Fprintln(w)
		for r := 0; r < rolesN; r++ {
			rt := sr.roles[r]
			var total time.Duration
			for _, d := range rt.byState {
				total += d
			}
			if total == 0 || r == roleOther && total < win/10 {
				continue
			}
			var cells []string
			for s := 0; s < stOther; s++ {
				if rt.byState[s] == 0 {
					continue
				}
				c := fmt.Sprintf("%s %v", stateNames[s], rt.byState[s].Round(time.Microsecond))
				if why, d := rt.topWhy(s); why != "" && d >= rt.byState[s]/4 {
					c += " [" + why + "]"
				}
				cells = append(cells, c)
			}
			fmt.Fprintf(w, "    %-18s %s\n", roleNames[r]+":", strings.Join(cells, ", "))
		}
		fmt.Fprintf(w, "    verdict: %s\n", sr.verdict)
		writePeers(w, sr) // stalltrace_peers.go
	}
}

// causeSummary totals the episodes of many traces by cause. A trace
// window overlaps the one before it on the same node (a window is longer
// than the least time between two snapshots), so an episode seen in both
// is counted twice: the summary is a distribution, not a count of
// stalls (synod_stage_stalls_total counts those).
type causeSummary struct {
	traces   int
	byCause  map[string]*causeTotal
	episodes int
	// idle counts the episodes of a consensus loop idle, waiting on the
	// others, by what the others' consensus loops did (peersVerdict).
	idle map[string]int
}

type causeTotal struct {
	episodes, marks int
	window, longest time.Duration
}

func (cs *causeSummary) add(rep *traceReport) {
	if cs.byCause == nil {
		cs.byCause = map[string]*causeTotal{}
	}
	cs.traces++
	for _, sr := range rep.stalls {
		ct := cs.byCause[sr.cause]
		if ct == nil {
			ct = &causeTotal{}
			cs.byCause[sr.cause] = ct
		}
		win := time.Duration(sr.to - sr.from)
		ct.episodes++
		ct.marks += len(sr.marks)
		ct.window += win
		ct.longest = max(ct.longest, win)
		cs.episodes++
		if strings.HasPrefix(sr.cause, "consensus loop idle") {
			if cs.idle == nil {
				cs.idle = map[string]int{}
			}
			cs.idle[peersVerdict(sr)]++
		}
	}
}

// write prints the episodes by cause, most frequent first.
func (cs *causeSummary) write(w io.Writer) {
	if cs.episodes == 0 {
		return
	}
	causes := make([]string, 0, len(cs.byCause))
	for c := range cs.byCause {
		causes = append(causes, c)
	}
	sort.Slice(causes, func(i, j int) bool {
		a, b := cs.byCause[causes[i]], cs.byCause[causes[j]]
		if a.episodes != b.episodes {
			return a.episodes > b.episodes
		}
		return causes[i] < causes[j]
	})
	fmt.Fprintf(w, "\nsummary: %d episode(s) in %d trace(s), by cause (first finding of each verdict)\n", cs.episodes, cs.traces)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  episodes\t%%\tstall marks\tmean ms\tlongest ms\tcause\n")
	for _, c := range causes {
		ct := cs.byCause[c]
		fmt.Fprintf(tw, "  %d\t%.0f\t%d\t%.1f\t%.1f\t%s\n", ct.episodes, 100*float64(ct.episodes)/float64(cs.episodes), ct.marks,
			float64(ct.window.Microseconds())/1000/float64(ct.episodes), float64(ct.longest.Microseconds())/1000, c)
	}
	tw.Flush()
	if len(cs.idle) > 0 {
		var keys []string
		for k := range cs.idle {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			return cs.idle[keys[i]] > cs.idle[keys[j]] || cs.idle[keys[i]] == cs.idle[keys[j]] && keys[i] < keys[j]
		})
		fmt.Fprintf(w, "consensus loop idle, waiting on the others, by what the others did then:\n")
		for _, k := range keys {
			fmt.Fprintf(w, "  %d  %s\n", cs.idle[k], k)
		}
	}
}
