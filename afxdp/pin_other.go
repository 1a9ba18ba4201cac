//go:build !linux

package afxdp

import "fmt"

// PinToCPU returns an error wrapping ErrNotSupported off Linux.
func PinToCPU(cpu int) error {
	return fmt.Errorf("afxdp: pinning to cpu %d: %w", cpu, ErrNotSupported)
}
