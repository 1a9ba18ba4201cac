package main

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// Host steal: the CPU time the hypervisor gave to other guests while this
// VM had work to run. On the shared 2-vCPU VMs these figures are measured
// on, it was 3 % of all CPU time over a day and 29 % during one overload
// run (2026-12-07); a phase the host starved is not a figure about the
// store. Every recorded window reports it (PhaseResult.HostStealPct) and
// the table prints it per scenario, so a reader can tell a slow run from
// a starved one.

// hostCPU is the machine's CPU time so far, in clock ticks, from the
// "cpu" line of /proc/stat: the sum of every state, and steal.
type hostCPU struct {
	total, steal uint64
	ok           bool
}

// procStatCPUFieldsMin is how many values the "cpu" line must have for
// steal to be among them (user nice system idle iowait irq softirq steal).
const procStatCPUFieldsMin = 8

// parseProcStatCPU reads the first line of /proc/stat. Guest time is
// already counted in user and nice, so only the first eight values are
// summed.
func parseProcStatCPU(b []byte) (hostCPU, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 1+procStatCPUFieldsMin || string(f[0]) != "cpu" {
		return hostCPU{}, errors.New("/proc/stat: no \"cpu\" line with steal time")
	}
	var h hostCPU
	for i := 1; i <= procStatCPUFieldsMin; i++ {
		v, err := strconv.ParseUint(string(f[i]), 10, 64)
		if err != nil {
			return hostCPU{}, fmt.Errorf("/proc/stat: cpu value %d: %w", i, err)
		}
		h.total += v
		if i == procStatCPUFieldsMin {
			h.steal = v
		}
	}
	h.ok = true
	return h, nil
}

// stealPct is the share of the CPU time between a and b (a first) that was
// stolen, in per cent; nil when either reading failed or no time passed.
func stealPct(a, b hostCPU) *float64 {
	if !a.ok || !b.ok || b.total <= a.total || b.steal < a.steal {
		return nil
	}
	p := float64(b.steal-a.steal) / float64(b.total-a.total) * 100
	return &p
}

// stealOf formats a phase's host steal for the table ("-": not measured).
func stealOf(ph *PhaseResult) string {
	if ph.HostStealPct == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f", *ph.HostStealPct)
}
