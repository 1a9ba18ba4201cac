package main

import (
	"fmt"
	"os"
	"testing"
)

// TestMain lets the test binary stand in for kvbench's own children (the
// hog, and the overload scenario's victims: victims_process.go) and for
// the other node of TestStallsSeesTheOtherNodes.
// startHog runs os.Executable() with "hog": under `go test` that is this
// binary, which without this ran the package's tests as the "hog" (the
// smoke test's hog phase burned no CPU on purpose, and each killed child
// left its tests' temporary directories behind in /tmp).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "hog" {
		if err := hogMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "victims" {
		if err := victimsMain(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if dir := os.Getenv(stallPeerHelperEnv); dir != "" {
		if err := runStallPeer(dir); err != nil { // stalltrace_test.go
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}
