package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
)

// Machine describes where the run happened.
type Machine struct {
	Hostname  string  `json:"hostname"`
	OS        string  `json:"os"`
	Arch      string  `json:"arch"`
	Kernel    string  `json:"kernel"`
	CPUModel  string  `json:"cpu_model"`
	CPUs      int     `json:"cpus"`
	MemoryGiB float64 `json:"memory_gib"`
	GoVersion string  `json:"go_version"`
	LoadAvg   string  `json:"load_avg_at_start"` // 1, 5, 15 min: other tenants of a shared VM show here
	DataFS    string  `json:"data_dir"`
}

func describeMachine(dataDir string) Machine {
	m := Machine{OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), DataFS: dataDir}
	m.Hostname, _ = os.Hostname()
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if i := strings.IndexByte(l, ':'); i >= 0 {
					m.CPUModel = strings.TrimSpace(l[i+1:])
				}
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		fmt.Sscanf(strings.TrimPrefix(strings.SplitN(string(b), "\n", 2)[0], "MemTotal:"), "%f", &kb)
		m.MemoryGiB = kb / (1 << 20)
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	return m
}

// Report is kvbench's JSON output.
type Report struct {
	Started time.Time     `json:"started"`
	Elapsed string        `json:"elapsed"`
	Machine Machine       `json:"machine"`
	Options Options       `json:"options"`
	Paths   []*PathResult `json:"paths"`
	// HostStealPct is the share of the machine's CPU time the hypervisor
	// stole over the whole run, in per cent (host_steal.go); nil: not
	// measured.
	HostStealPct *float64 `json:"host_steal_pct,omitempty"`
	Headline     Headline `json:"headline"`
	Notes        []string `json:"notes"`
}

// Headline holds the figures the closing note quotes.
type Headline struct {
	Against           string             `json:"against"` // paxos-accel, or paxos when accel is n/a
	WriteP99Ratio     float64            `json:"write_p99_ratio_raft_over"`
	WriteP999Ratio    float64            `json:"write_p999_ratio_raft_over"`
	InterferenceRatio map[string]float64 `json:"interference_ratio"`
	LeaderChangesHog  map[string]int     `json:"leader_changes_hog"`
}

func (r *Report) headline() {
	h := Headline{InterferenceRatio: map[string]float64{}, LeaderChangesHog: map[string]int{}}
	byName := map[string]*PathResult{}
	for _, p := range r.Paths {
		byName[p.Name] = p
		if p.Status == "ok" {
			if _, ok := p.Phases["noisy"]; ok {
				h.InterferenceRatio[p.Name] = p.InterferenceRatio
			}
			if _, ok := p.Phases["hog"]; ok {
				h.LeaderChangesHog[p.Name] = p.LeaderChangesHog
			}
		}
	}
	raft := byName["raft"]
	for _, other := range []string{"paxos-accel", "paxos"} {
		o := byName[other]
		if raft == nil || o == nil || raft.Status != "ok" || o.Status != "ok" {
			continue
		}
		rs, os := raft.Phases["steady"], o.Phases["steady"]
		if rs == nil || os == nil || os.Write.P99Us == 0 || os.Write.P999Us == 0 {
			continue
		}
		h.Against = other
		h.WriteP99Ratio = float64(rs.Write.P99Us) / float64(os.Write.P99Us)
		h.WriteP999Ratio = float64(rs.Write.P999Us) / float64(os.Write.P999Us)
		break
	}
	r.Headline = h
}

func ms(us int64) string {
	if us == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(us)/1000)
}

// writeTable prints the paths side by side: one column per path, every
// column headed by its durability mode.
func writeTable(w io.Writer, r *Report) {
	m := r.Machine
	fmt.Fprintf(w, "\nkvbench: %d replicas, %d tenants (tenant 1 noisy), %.0f%% reads, %d keys/tenant %s, %d B values, %.0f ops/s offered (Poisson, open loop), phases %v + %v warm-up\n",
		r.Options.Nodes, r.Options.Tenants, r.Options.ReadRatio*100, r.Options.Keys, r.Options.Dist, r.Options.ValueBytes, r.Options.Rate, r.Options.Duration, r.Options.Warmup)
	fmt.Fprintf(w, "machine: %s, %d CPUs, %.1f GiB, kernel %s, %s, load avg at start %s; data in %s\n",
		m.CPUModel, m.CPUs, m.MemoryGiB, m.Kernel, m.GoVersion, m.LoadAvg, m.DataFS)
	fmt.Fprintf(w, "latencies in ms from the intended send time; steady phase unless the row says otherwise\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, f func(p *PathResult) string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, p := range r.Paths {
			if p.Status != "ok" {
				fmt.Fprintf(tw, "%s\t", p.Status)
				continue
			}
			fmt.Fprintf(tw, "%s\t", f(p))
		}
		fmt.Fprintln(tw)
	}
	// steadyRow is a row of the steady phase: left out when no path ran
	// it (--scenarios ceiling,tail,... prints no empty steady figures).
	steadyRan := ranScenario(r, scenSteady)
	steadyRow := func(name string, f func(p *PathResult) string) {
		if steadyRan {
			row(name, f)
		}
	}
	phase := func(p *PathResult, s string) *PhaseResult {
		if ph := p.Phases[s]; ph != nil {
			return ph
		}
		return &PhaseResult{}
	}
	fmt.Fprintf(tw, "path\t")
	for _, p := range r.Paths {
		fmt.Fprintf(tw, "%s\t", p.Name)
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "durability\t")
	for _, p := range r.Paths {
		fmt.Fprintf(tw, "%s\t", strings.SplitN(p.Durability, " ", 2)[0])
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "transport / accel\t")
	for _, p := range r.Paths {
		a := "off"
		if p.Accel {
			a = "on"
		}
		fmt.Fprintf(tw, "%s / %s\t", p.Transport, a)
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "nodes on\t")
	for _, p := range r.Paths {
		fmt.Fprintf(tw, "%s\t", p.Topology)
	}
	fmt.Fprintln(tw)
	for _, pc := range []struct {
		name string
		get  func(ph *PhaseResult) int64
	}{
		{"P50", func(ph *PhaseResult) int64 { return ph.Read.P50Us }},
		{"P90", func(ph *PhaseResult) int64 { return ph.Read.P90Us }},
		{"P99", func(ph *PhaseResult) int64 { return ph.Read.P99Us }},
		{"P99.9", func(ph *PhaseResult) int64 { return ph.Read.P999Us }},
		{"max", func(ph *PhaseResult) int64 { return ph.Read.MaxUs }},
	} {
		steadyRow("read "+pc.name, func(p *PathResult) string { return ms(pc.get(phase(p, "steady"))) })
	}
	for _, pc := range []struct {
		name string
		get  func(ph *PhaseResult) int64
	}{
		{"P50", func(ph *PhaseResult) int64 { return ph.Write.P50Us }},
		{"P90", func(ph *PhaseResult) int64 { return ph.Write.P90Us }},
		{"P99", func(ph *PhaseResult) int64 { return ph.Write.P99Us }},
		{"P99.9", func(ph *PhaseResult) int64 { return ph.Write.P999Us }},
		{"max", func(ph *PhaseResult) int64 { return ph.Write.MaxUs }},
	} {
		steadyRow("write "+pc.name, func(p *PathResult) string { return ms(pc.get(phase(p, "steady"))) })
	}
	steadyRow("throughput ops/s", func(p *PathResult) string { return fmt.Sprintf("%.0f", phase(p, "steady").ThroughputOps) })
	steadyRow("errors (steady)", func(p *PathResult) string { return fmt.Sprint(phase(p, "steady").Errors) })
	steadyRow("victim P99 quiet", func(p *PathResult) string { return ms(p.VictimP99SteadyUs) })
	row("victim P99 noisy", func(p *PathResult) string {
		if _, ok := p.Phases["noisy"]; !ok {
			return "-"
		}
		return ms(p.VictimP99NoisyUs)
	})
	row("interference x", func(p *PathResult) string {
		if p.InterferenceRatio == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", p.InterferenceRatio)
	})
	row("write P99 under hog", func(p *PathResult) string {
		if _, ok := p.Phases["hog"]; !ok {
			return "-"
		}
		return ms(p.Phases["hog"].Write.P99Us)
	})
	row("client lag max ms", func(p *PathResult) string {
		var lag float64
		for _, ph := range p.Phases {
			lag = max(lag, ph.ScheduleLagMs)
		}
		return fmt.Sprintf("%.1f", lag)
	})
	row("kernel UDP dgrams", func(p *PathResult) string {
		if !p.netns {
			return "-"
		}
		return fmt.Sprint(p.KernelUDPDatagrams)
	})
	row("CPU-s / 1000 ops", func(p *PathResult) string {
		v := phase(p, "steady").CPUPer1000
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f", v)
	})
	scenarioRows(r, row) // ceiling, tail, overload, load; leader changes per scenario (report_scenarios.go)
	tw.Flush()
	fmt.Fprintln(w, "\ndurability per column:")
	for _, p := range r.Paths {
		line := fmt.Sprintf("  %-16s %s", p.Name, p.Durability)
		if p.Base != "" {
			line += fmt.Sprintf("  [ablation of %s: %s]", p.Base, p.Lever)
		}
		if p.Status != "ok" {
			line += fmt.Sprintf("  -- %s: %s", p.Status, p.Reason)
		}
		fmt.Fprintln(w, line)
	}
	writeLoadDetail(w, r)
	writeStageDetail(w, r) // stages.go
	h := r.Headline
	if h.Against != "" {
		fmt.Fprintf(w, "\nwrite P99 raft / %s = %.2fx, write P99.9 raft / %s = %.2fx\n", h.Against, h.WriteP99Ratio, h.Against, h.WriteP999Ratio)
	}
	writeProfileList(w, r) // node_profiles.go
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// writeJSON writes the report to dir/kvbench.json.
func writeJSON(dir string, r *Report) (string, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", err
	}
	p := filepath.Join(dir, "kvbench.json")
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", err
	}
	return p, os.WriteFile(p, b, 0o640)
}
