package afxdp

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// PinToCPU locks the calling goroutine to its OS thread and restricts that
// thread to cpu. The goroutine stays locked (call it at the top of a
// dedicated loop goroutine); the thread is discarded by the Go runtime
// when the goroutine exits locked. A cpu that does not exist or is outside
// the process's allowed set is an error, and the thread is unlocked.
func PinToCPU(cpu int) error {
	if cpu < 0 || cpu >= cpuSetSizeMax {
		return fmt.Errorf("afxdp: pinning: cpu %d out of range 0..%d", cpu, cpuSetSizeMax-1)
	}
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return fmt.Errorf("afxdp: reading cpu affinity: %w", err)
	}
	if !allowed.IsSet(cpu) {
		return fmt.Errorf("afxdp: pinning: cpu %d is not available to this process (allowed: %d cpus)", cpu, allowed.Count())
	}
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("afxdp: pinning to cpu %d: %w", cpu, err)
	}
	return nil
}

// cpuSetSizeMax is how many CPUs a unix.CPUSet can name.
const cpuSetSizeMax = len(unix.CPUSet{}) * 64
