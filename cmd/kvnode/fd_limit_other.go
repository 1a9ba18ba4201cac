//go:build !unix

package main

// nofileLimit is unknown here (0).
func nofileLimit() uint64 { return 0 }
