//go:build !linux

package childproc

import "os/exec"

// Start is cmd.Start: only Linux has PR_SET_PDEATHSIG, so elsewhere a
// child outlives a parent that exits without cleanup.
func Start(cmd *exec.Cmd) error { return cmd.Start() }
