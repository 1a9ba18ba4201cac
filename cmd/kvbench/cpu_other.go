//go:build !linux

package main

import "errors"

// ErrNotSupported: CPU accounting and pinning need Linux.
var ErrNotSupported = errors.New("kvbench: not supported on this platform")

func cpuSeconds(pid int) (float64, error) { return 0, ErrNotSupported }

func pinProcess(pid int, cpus []int) error { return ErrNotSupported }
