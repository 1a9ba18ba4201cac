package e2e

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"synod/internal/kvmodel"
)

// TestCheckerCatchesPlantedBug feeds the checker histories with planted
// anomalies (a stale read, a lost write, a read of a value never written)
// and a correct one: the checker must flag exactly the planted ones.
func TestCheckerCatchesPlantedBug(t *testing.T) {
	put := func(c int, k, v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: kvmodel.Input{Put: true, Key: k, Value: v}, Call: call, Output: kvmodel.Output{}, Return: ret}
	}
	get := func(c int, k string, found bool, v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: kvmodel.Input{Key: k}, Call: call, Output: kvmodel.Output{Found: found, Value: v}, Return: ret}
	}
	cases := []struct {
		name string
		ops  []porcupine.Operation
		ok   bool
	}{
		{"correct, with concurrency and a pending write", []porcupine.Operation{
			put(0, "x", "1", 0, 10),
			get(1, "x", true, "1", 5, 15),
			put(2, "x", "2", 12, pendingReturn),
			get(0, "x", true, "2", 20, 30),
			get(1, "y", false, "", 0, 40),
		}, true},
		{"stale read after a completed write", []porcupine.Operation{
			put(0, "x", "1", 0, 10),
			put(0, "x", "2", 11, 20),
			get(1, "x", true, "1", 21, 30),
		}, false},
		{"acknowledged write lost", []porcupine.Operation{
			put(0, "x", "1", 0, 10),
			get(1, "x", false, "", 11, 20),
		}, false},
		{"value never written", []porcupine.Operation{
			put(0, "x", "1", 0, 10),
			get(1, "x", true, "7", 11, 20),
		}, false},
		{"reads disagree on order (one key each, other key clean)", []porcupine.Operation{
			put(0, "k", "a", 0, 100),
			put(1, "k", "b", 0, 100),
			get(2, "k", true, "a", 101, 110),
			get(2, "k", true, "b", 111, 120),
			get(3, "k", true, "a", 121, 130),
			put(0, "z", "q", 0, 1),
		}, false},
	}
	for _, tc := range cases {
		h := &history{ops: tc.ops}
		res := h.check(10 * time.Second)
		if (res == porcupine.Ok) != tc.ok {
			t.Fatalf("%s: checker said %v, want ok=%v", tc.name, res, tc.ok)
		}
	}
}
