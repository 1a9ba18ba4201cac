//go:build linux

package childproc

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// request is one child to start and where to say how it went.
type request struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	spawnOnce sync.Once
	spawnC    chan request
)

// spawner forks every child, on a thread it never gives back.
func spawner() {
	runtime.LockOSThread() // never unlocked: the thread lives as long as the process
	for req := range spawnC {
		req.done <- req.cmd.Start()
	}
}

// Start starts cmd as cmd.Start does, so that the child is SIGKILLed when
// this process exits, however it exits. It overwrites
// cmd.SysProcAttr.Pdeathsig; the caller still Waits for the child.
func Start(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnC = make(chan request)
		go spawner()
	})
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	done := make(chan error, 1)
	spawnC <- request{cmd: cmd, done: done}
	return <-done
}
