//go:build !linux

package main

import "errors"

func rssBytes(pid int) (int64, error) { return 0, errors.New("RSS needs /proc (Linux)") }

func diskBytes(path string) (int64, error) {
	return 0, errors.New("disk use is measured on Linux only")
}

func readHostCPU() hostCPU { return hostCPU{} }
