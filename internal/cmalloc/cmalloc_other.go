//go:build !(linux && cgo)

package cmalloc

import "errors"

// Tune does nothing without cgo: Pebble's manual memory is then Go heap.
func Tune() (bool, error) { return false, nil }

// MappedBytes has nothing to report without cgo.
func MappedBytes() (int64, error) { return 0, errors.New("cmalloc: no C allocator in this build") }
