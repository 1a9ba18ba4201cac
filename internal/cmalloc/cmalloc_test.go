//go:build linux && cgo

package cmalloc

import (
	"os"
	"testing"
)

// plantedUntuned is the GLIBC_TUNABLES the planted child runs with: a
// malloc tunable at its default, so the constructor leaves glibc alone.
const plantedUntuned = "glibc.malloc.tcache_count=7"

// TestTuneFixesMmapThreshold: in this (tuned) process, a block of twice
// MmapThresholdBytes is mapped on its own even after an equal one was
// freed. With glibc's dynamic threshold the free raises the threshold past
// that size and the second block comes from an arena, where it stays
// resident after it is freed: TestUntunedThresholdRises plants exactly
// that and shows the check fails there.
func TestTuneFixesMmapThreshold(t *testing.T) {
	changed, err := Tune()
	if err != nil {
		t.Fatal(err)
	}
	if !changed {
		if _, err := MappedBytes(); err != nil {
			t.Skip("not glibc: nothing to tune")
		}
		t.Skipf("GLIBC_TUNABLES=%q sets malloc tunables: left alone", os.Getenv("GLIBC_TUNABLES"))
	}
	if !secondBlockMapped(t) {
		t.Fatal("a block of 2x the threshold allocated after an equal one was freed is not mapped on its own: the threshold moved")
	}
}

// TestUntunedThresholdRises is the planted bug for the test above: a child
// that the constructor left alone (GLIBC_TUNABLES sets a malloc tunable)
// keeps glibc's dynamic threshold, and the second block is not mapped.
func TestUntunedThresholdRises(t *testing.T) {
	if os.Getenv("GLIBC_TUNABLES") == plantedUntuned {
		if changed, _ := Tune(); changed {
			os.Exit(4) // the constructor did not leave it alone
		}
		if secondBlockMapped(t) {
			os.Exit(3) // the planted condition did not show
		}
		return
	}
	if _, err := MappedBytes(); err != nil {
		t.Skip("not glibc")
	}
	if err := exec(t, "-test.run=^TestUntunedThresholdRises$").Run(); err != nil {
		t.Fatalf("untuned child: %v (exit 3: glibc mapped the second block on its own, so the tuned test proves nothing; 4: GLIBC_TUNABLES did not stop the constructor)", err)
	}
}

// TestConstantsMatchC: the constructor's copies of the constants are the
// Go ones.
func TestConstantsMatchC(t *testing.T) {
	if _, err := MappedBytes(); err != nil {
		t.Skip("not glibc")
	}
	if a, th := cConstants(); a != ArenasMax || th != MmapThresholdBytes {
		t.Fatalf("C constructor uses arenas %d threshold %d; Go says %d and %d", a, th, ArenasMax, MmapThresholdBytes)
	}
}

// secondBlockMapped frees one block of 2x the threshold and reports
// whether the next equal block is mapped on its own.
func secondBlockMapped(t *testing.T) bool {
	const n = 2 * MmapThresholdBytes
	p := Malloc(n)
	Free(p)
	before, err := MappedBytes()
	if err != nil {
		t.Fatal(err)
	}
	q := Malloc(n)
	defer Free(q)
	after, _ := MappedBytes()
	return after-before >= n
}
