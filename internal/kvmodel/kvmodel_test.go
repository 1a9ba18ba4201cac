package kvmodel

import (
	"math"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func put(c int, k, v string, call, ret int64) porcupine.Operation {
	return porcupine.Operation{ClientId: c, Input: Input{Put: true, Key: k, Value: v}, Call: call, Output: Output{}, Return: ret}
}

func get(c int, k string, found bool, v string, call, ret int64) porcupine.Operation {
	return porcupine.Operation{ClientId: c, Input: Input{Key: k}, Call: call, Output: Output{Found: found, Value: v}, Return: ret}
}

func cas(c int, k, expect, v string, mismatch bool, call, ret int64) porcupine.Operation {
	in := Input{CAS: true, Key: k, Expect: expect, ExpectAbsent: expect == "", Value: v}
	return porcupine.Operation{ClientId: c, Input: in, Call: call, Output: Output{Mismatch: mismatch, Unknown: ret == math.MaxInt64}, Return: ret}
}

// TestModel checks correct histories pass and planted non-linearizable
// ones (stale read, lost write, value never written, a violation on one
// key hidden among clean keys) are rejected.
func TestModel(t *testing.T) {
	cases := []struct {
		name string
		ops  []porcupine.Operation
		ok   bool
	}{
		{"empty", nil, true},
		{"absent key reads absent", []porcupine.Operation{get(0, "x", false, "", 0, 1)}, true},
		{"concurrent put, pending put", []porcupine.Operation{
			put(0, "x", "1", 0, 10),
			get(1, "x", true, "1", 5, 15),
			put(2, "x", "2", 12, math.MaxInt64),
			get(0, "x", true, "2", 20, 30),
			get(1, "y", false, "", 0, 40),
		}, true},
		{"keys are independent registers", []porcupine.Operation{
			put(0, "a", "1", 0, 10),
			put(1, "b", "2", 0, 10),
			get(2, "a", true, "1", 11, 20),
			get(2, "b", true, "2", 21, 30),
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
		{"reads disagree on order on one key, other key clean", []porcupine.Operation{
			put(0, "k", "a", 0, 100),
			put(1, "k", "b", 0, 100),
			get(2, "k", true, "a", 101, 110),
			get(2, "k", true, "b", 111, 120),
			get(3, "k", true, "a", 121, 130),
			put(0, "z", "q", 0, 1),
			get(1, "z", true, "q", 2, 3),
		}, false},
	}
	cases = append(cases, []struct {
		name string
		ops  []porcupine.Operation
		ok   bool
	}{
		{"cas chain", []porcupine.Operation{
			cas(0, "x", "", "1", false, 0, 10),
			cas(0, "x", "1", "2", false, 11, 20),
			cas(1, "x", "1", "3", true, 21, 30),
			get(1, "x", true, "2", 31, 40),
		}, true},
		{"cas from absent on a present key said ok", []porcupine.Operation{
			put(0, "x", "1", 0, 10),
			cas(1, "x", "", "2", false, 11, 20),
		}, false},
		{"cas said ok but never took effect", []porcupine.Operation{
			put(0, "x", "1", 0, 10),
			cas(1, "x", "1", "2", false, 11, 20),
			get(2, "x", true, "1", 21, 30),
		}, false},
		{"cas said mismatch on a matching value", []porcupine.Operation{
			put(0, "x", "1", 0, 10),
			cas(1, "x", "1", "2", true, 11, 20),
		}, false},
		{"unknown cas took effect, or did not", []porcupine.Operation{
			put(0, "x", "1", 0, 10),
			cas(1, "x", "1", "2", false, 11, math.MaxInt64),
			get(2, "x", true, "1", 21, 30),
			get(2, "x", true, "2", 31, 40),
		}, true},
	}...)
	for _, tc := range cases {
		res := porcupine.CheckOperationsTimeout(Model, tc.ops, 10*time.Second)
		if (res == porcupine.Ok) != tc.ok {
			t.Errorf("%s: checker said %v, want ok=%v", tc.name, res, tc.ok)
		}
	}
}

// TestPartition checks histories split by key, in sorted key order, each
// key's operations in history order.
func TestPartition(t *testing.T) {
	ops := []porcupine.Operation{
		put(0, "b", "1", 0, 1),
		put(0, "a", "2", 2, 3),
		get(1, "b", true, "1", 4, 5),
	}
	parts := partition(ops)
	if len(parts) != 2 || len(parts[0]) != 1 || len(parts[1]) != 2 {
		t.Fatalf("partition sizes %v", parts)
	}
	if parts[0][0].Input.(Input).Key != "a" || parts[1][1].Call != 4 {
		t.Fatalf("partition order wrong: %v", parts)
	}
}

// TestDescribe checks the operation descriptions porcupine's view shows.
func TestDescribe(t *testing.T) {
	for _, tc := range []struct {
		in   Input
		out  Output
		want string
	}{
		{Input{Put: true, Key: "k", Value: "v"}, Output{}, "put(k, v)"},
		{Input{Key: "k"}, Output{}, "get(k) -> absent"},
		{Input{Key: "k"}, Output{Found: true, Value: "v"}, "get(k) -> v"},
		{Input{CAS: true, Key: "k", ExpectAbsent: true, Value: "v"}, Output{}, "cas(k, absent -> v) -> ok"},
		{Input{CAS: true, Key: "k", Expect: "a", Value: "v"}, Output{Mismatch: true}, "cas(k, a -> v) -> mismatch"},
	} {
		if got := Model.DescribeOperation(tc.in, tc.out); got != tc.want {
			t.Errorf("describe %+v %+v = %q, want %q", tc.in, tc.out, got, tc.want)
		}
	}
}
