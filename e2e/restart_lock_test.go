package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRestartWaitsForTheLogLock: a node started while its acceptor log's
// lock is still held (here by the test, as a SIGKILLed predecessor's is
// until the kernel has closed its files) waits for the lock and starts
// once it is let go, instead of exiting "in use by another Log" (an
// outside nemesis restarted nodes the moment it killed them and lost one
// that way). A second kvnode on the log of a node that runs is still
// refused: it exits once the wait (pmemLockWaitMax, 5 s) has passed.
func TestRestartWaitsForTheLogLock(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the acceptor log is locked on Linux only")
	}
	c := newCluster(t, 3)
	nd := c.nodes[0]
	c.kill(nd)
	path := filepath.Join(c.pdir, fmt.Sprintf("n%d.pmem", nd.id))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("taking the dead node's lock: %v", err)
	}
	const held = 1500 * time.Millisecond
	go func() {
		time.Sleep(held)
		f.Close() // the lock goes with the last descriptor
	}()
	start := time.Now()
	c.start(nd) // fails the test if the node exits during start-up
	took := time.Since(start)
	logb, _ := os.ReadFile(nd.logPath)
	waited := bytes.Contains(logb, []byte("waiting for it to let go"))
	if !waited || took < held {
		t.Fatalf("the node started in %v (the lock held %v), logged the wait: %v", took, held, waited)
	}
	c.waitCaughtUp(nd, 1)

	// A second kvnode on node 1's log while node 1 runs.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	second := time.Now()
	out, err := exec.CommandContext(ctx, kvnodeBin, "--config", nd.cfgPath).CombinedOutput()
	secondTook := time.Since(second)
	if err == nil || !strings.Contains(string(out), "in use by another Log") {
		t.Fatalf("a second kvnode on a live node's log: err %v after %v, output:\n%s", err, secondTook, tail(string(out), 2000))
	}
	if !nd.running() {
		t.Fatal("node 1 stopped while a second kvnode tried its log")
	}
	fmt.Printf("e2e log lock: restart_waited=%v started_after=%v (lock held %v); second_kvnode_refused_after=%v\n",
		waited, took.Round(10*time.Millisecond), held, secondTook.Round(10*time.Millisecond))
}
