package main

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// cpuAllowed reports whether this process's affinity mask includes cpu.
func cpuAllowed(cpu int) bool {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return false
	}
	return set.IsSet(cpu)
}

func allowedCPUs(ncpu int) string {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return "unknown"
	}
	var s []string
	for i := 0; i < max(ncpu, 1024); i++ {
		if set.IsSet(i) {
			s = append(s, fmt.Sprint(i))
		}
	}
	return strings.Join(s, ",")
}
