//go:build linux && cgo

package cmalloc

import (
	"os"
	osexec "os/exec"
	"testing"
)

// exec is this test binary run again with args, the constructor turned
// off by plantedUntuned.
func exec(t *testing.T, args ...string) *osexec.Cmd {
	t.Helper()
	cmd := osexec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "GLIBC_TUNABLES="+plantedUntuned)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd
}
