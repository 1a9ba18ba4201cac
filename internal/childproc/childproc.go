// Package childproc starts child processes that die with their parent.
//
// A test binary that times out, or a kvbench that is killed, exits
// without running its cleanups; the kvnodes it started used to live on,
// holding ports, disk and CPU. Start asks the kernel to SIGKILL the child
// when its parent goes (PR_SET_PDEATHSIG), however it goes.
//
// The kernel sends that signal when the *thread* that forked the child
// exits, not the process (golang/go#27505), and the Go runtime ends a
// thread whenever a goroutine locked to it exits without unlocking
// (afxdp/netns.Run does, on purpose, to drop a thread that entered
// another network namespace). A child forked from an ordinary goroutine
// could therefore be killed in the middle of a run, when some later
// netns.Run happened to lock and end the thread that forked it. So Start
// forks every child from one goroutine locked to its thread for the life
// of the process: that thread ends only with the process.
package childproc
