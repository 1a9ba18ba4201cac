package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// clockTicksPerSec is USER_HZ, 100 on every Linux architecture Go runs on.
const clockTicksPerSec = 100

// cpuSeconds returns the user+system CPU time of process pid (all its
// threads), from /proc/PID/stat.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields resume after ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("odd /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	return float64(ut+st) / clockTicksPerSec, nil
}

// pinProcess sets the CPU affinity of every thread of pid to cpus (nil:
// every CPU of this machine). Threads created later inherit the affinity
// of the thread that creates them, so a Go process stays pinned.
func pinProcess(pid int, cpus []int) error {
	var set unix.CPUSet
	if cpus == nil {
		for c := 0; c < numCPU(); c++ {
			set.Set(c)
		}
	} else {
		for _, c := range cpus {
			set.Set(c)
		}
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(tasks) == 0 {
		return fmt.Errorf("listing threads of %d: %v", pid, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(filepath.Base(t))
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("pinning thread %d of %d: %w", tid, pid, err)
		}
	}
	return nil
}
