package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"time"
)

const hogThreadsPerCPU = 4

// hogMain is `kvbench hog N`: burn N CPUs until killed. kvbench starts it
// as a child pinned to the leader's CPUs.
func hogMain(args []string) error {
	n := 1
	if len(args) > 0 {
		v, err := strconv.Atoi(args[0])
		if err != nil || v < 1 || v > 1024 {
			return fmt.Errorf("hog: bad cpu count %q", args[0])
		}
		n = v
	}
	// hogThreadsPerCPU spinning threads per CPU: the scheduler shares a
	// CPU per thread, so several threads take most of it from the leader
	// as a multi-threaded batch job would.
	threads := n * hogThreadsPerCPU
	runtime.GOMAXPROCS(threads)
	for i := 0; i < threads; i++ {
		go func() {
			x := uint64(1)
			for {
				x = x*6364136223846793005 + 1442695040888963407
				if x == 0 {
					fmt.Print("")
				}
			}
		}()
	}
	select {}
}

// hog is a running CPU hog child.
type hog struct{ cmd *exec.Cmd }

// startHog burns cpus (pinned to them) in a child process.
func startHog(cpus []int) (*hog, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "hog", strconv.Itoa(len(cpus)))
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the cpu hog: %w", err)
	}
	// Pin after start: the hog's threads come up within milliseconds, and
	// pinning again shortly after catches any created since.
	pinProcess(cmd.Process.Pid, cpus)
	time.Sleep(20 * time.Millisecond)
	pinProcess(cmd.Process.Pid, cpus)
	return &hog{cmd: cmd}, nil
}

func (h *hog) stop() {
	h.cmd.Process.Kill()
	h.cmd.Wait()
}

func numCPU() int { return runtime.NumCPU() }
