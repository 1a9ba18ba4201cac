//go:build linux

package childproc

import (
	"errors"
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

// helperEnv makes the test binary, run again by orphan, act as a parent
// that starts a child and exits at once.
const helperEnv = "SYNOD_CHILDPROC_HELPER"

// goneWait bounds how long an orphaned child may take to die.
const goneWait = 3 * time.Second

// errMainThread: a test goroutine ran on the process's main thread.
var errMainThread = errors.New("a test goroutine ran on the main thread")

// init locks the main goroutine to the main thread for the life of the
// test binary, so that no other goroutine ever runs there. Go cannot end
// the main thread: a goroutine that exits locked to it parks it instead,
// so TestChildOutlivesTheCallersThread's naive child, started from such a
// goroutine, lived (seen in two CI runs of 2026-12-02, when the test's own
// goroutine ran on the main thread and the one it started ran there too).
func init() { runtime.LockOSThread() }

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		helper(mode) // exits
	}
	os.Exit(m.Run())
}

// TestChildDiesWithItsParent: a child started with Start by a process that
// then exits without cleaning up (as a timed-out go test does) dies with
// it, also when the goroutine that called Start ran on a thread that has
// ended since (the thread-death trap of PR_SET_PDEATHSIG); one started by
// plain Start outlives its parent (the check's planted twin).
func TestChildDiesWithItsParent(t *testing.T) {
	for _, mode := range []string{"guarded", "guarded-thread-ended", "plain"} {
		pid := orphan(t, mode)
		gone := Gone(pid, goneWait)
		if !gone {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		fmt.Printf("childproc: mode=%s died_with_parent=%v\n", mode, gone)
		if want := mode != "plain"; gone != want {
			t.Fatalf("child %d started %s: died with its parent %v, want %v", pid, mode, gone, want)
		}
	}
}

// TestChildOutlivesTheCallersThread: a child started with Start from a
// goroutine whose thread then ends (as afxdp/netns.Run's do) keeps
// running while this process lives; one given PR_SET_PDEATHSIG and
// started by that goroutine itself, the naive way, is killed when the
// thread ends (the trap Start avoids, and this check's planted twin).
func TestChildOutlivesTheCallersThread(t *testing.T) {
	for _, naive := range []bool{false, true} {
		cmd := exec.Command("sleep", "60")
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			if syscall.Gettid() == syscall.Getpid() {
				// Go parks the main thread instead of ending it; init
				// keeps every test goroutine off it.
				runtime.UnlockOSThread()
				errc <- errMainThread
				return
			}
			if naive {
				cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
				errc <- cmd.Start()
				return
			}
			errc <- Start(cmd)
		}()
		err := <-errc
		if err != nil {
			t.Fatal(err)
		}
		died := Gone(cmd.Process.Pid, goneWait)
		cmd.Process.Kill()
		cmd.Wait()
		fmt.Printf("childproc: thread ended, naive=%v child_died=%v\n", naive, died)
		if died != naive {
			t.Fatalf("started naive=%v from a goroutine whose thread ended: the child died %v, want %v", naive, died, naive)
		}
	}
}

// orphan runs this test binary as helper in mode and returns the pid of
// the child it left behind.
func orphan(t *testing.T, mode string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper %s: %v (%s)", mode, err, out)
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
	t.Fatalf("helper %s printed no pid: %s", mode, out)
	return 0
}

// helper starts `sleep 600` (through Start unless mode is "plain"; with
// "guarded-thread-ended", from a goroutine whose thread ends right after),
// prints its pid and exits at once: no cleanup, no Wait.
func helper(mode string) {
	cmd := exec.Command("sleep", "600")
	var err error
	switch mode {
	case "plain":
		err = cmd.Start()
	case "guarded-thread-ended":
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			errc <- Start(cmd)
		}()
		err = <-errc
		time.Sleep(50 * time.Millisecond)
	default:
		err = Start(cmd)
	}
	if err != nil {
		fmt.Println("start:", err)
		os.Exit(2)
	}
	fmt.Printf("child pid %d\n", cmd.Process.Pid)
	os.Exit(0)
}
