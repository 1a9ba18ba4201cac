//go:build unix

package childproc

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// goneSleep is how often Gone looks again.
const goneSleep = 20 * time.Millisecond

// Gone reports whether process pid ceased to exist, or is a zombie (dead,
// not yet reaped), within d. For tests that check a child died.
func Gone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			return true
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			// pid (comm) state ...: comm may hold spaces, so split after ')'.
			rest := string(b)[strings.LastIndexByte(string(b), ')')+1:]
			if f := strings.Fields(rest); len(f) > 0 && f[0] == "Z" {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(goneSleep)
	}
}
