package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Child processes die with the test binary. A go test that times out (or
// is killed) exits without running its cleanups; kvnodes it started used
// to live on, holding ports, disk and CPU on a developer's machine. Every
// kvnode the suite starts goes through startChild, which asks the kernel
// to SIGKILL it when its parent goes (PR_SET_PDEATHSIG).
//
// The kernel sends that signal when the *thread* that forked the child
// exits, not the process (golang/go#27505), and the Go runtime ends a
// thread whenever a goroutine locked to it exits (afxdp/netns.Run does,
// on purpose). So every child is forked from one goroutine locked to its
// thread for the life of the test binary: that thread ends only with the
// process.

// spawnReq is one child to start and where to say how it went.
type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// spawnC feeds the spawner goroutine (started at init, never ending).
var spawnC = make(chan spawnReq)

func init() {
	go func() {
		runtime.LockOSThread() // never unlocked: this thread forks every child
		for req := range spawnC {
			req.done <- req.cmd.Start()
		}
	}()
}

// startChild starts cmd (as cmd.Start would) so that it is SIGKILLed when
// the test binary exits, however it exits.
func startChild(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	done := make(chan error, 1)
	spawnC <- spawnReq{cmd: cmd, done: done}
	return <-done
}

// childHelperEnv makes the test binary, run again by
// TestChildrenDieWithTheTestBinary, run childHelper instead of its tests.
const childHelperEnv = "SYNOD_E2E_CHILD_HELPER"

// childGoneWait bounds how long the orphaned child may take to die.
const childGoneWait = 3 * time.Second

// TestChildrenDieWithTheTestBinary: a child started with startChild by a
// process that then exits without cleaning up (as a timed-out go test
// does) is killed with it; one started by plain Start, as the suite did,
// outlives it (the check's planted twin).
func TestChildrenDieWithTheTestBinary(t *testing.T) {
	for _, guarded := range []bool{true, false} {
		pid := orphanChild(t, guarded)
		gone := waitGone(pid, childGoneWait)
		if !gone {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		fmt.Printf("e2e children: guarded=%v pid=%d died_with_parent=%v\n", guarded, pid, gone)
		if gone != guarded {
			t.Fatalf("child %d started guarded=%v: died with its parent %v", pid, guarded, gone)
		}
	}
}

// orphanChild runs this test binary as childHelper and returns the pid of
// the child it left behind.
func orphanChild(t *testing.T, guarded bool) int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childHelperEnv+"="+strconv.FormatBool(guarded))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v (%s)", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if s, ok := strings.CutPrefix(line, "child pid "); ok {
			pid, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("helper printed no pid: %s", out)
	return 0
}

// childHelper is TestChildrenDieWithTheTestBinary's helper, run by
// TestMain instead of the tests in the process that test starts: it
// starts `sleep 600` (through startChild when mode is "true", from the
// main goroutine, not the spawner's), prints its pid and exits at once,
// as a timed-out test binary does: no cleanup, no Wait.
func childHelper(mode string) {
	cmd := exec.Command("sleep", "600")
	var err error
	if mode == "true" {
		err = startChild(cmd)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		fmt.Println("start:", err)
		os.Exit(2)
	}
	fmt.Printf("child pid %d\n", cmd.Process.Pid)
	os.Exit(0)
}

// waitGone reports whether process pid ceased to exist (or is a zombie no
// one reaps, i.e. dead) within d.
func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			return true
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
