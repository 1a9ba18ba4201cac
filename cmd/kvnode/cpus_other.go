//go:build !linux

package main

import "fmt"

func cpuAllowed(cpu int) bool { return false }

func allowedCPUs(ncpu int) string { return fmt.Sprintf("none (pinning is Linux-only; %d CPUs)", ncpu) }
