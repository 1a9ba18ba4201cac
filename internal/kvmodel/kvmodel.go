// Package kvmodel is the porcupine linearizability model of synod's
// client-level key-value operations, shared by the end-to-end tests (e2e)
// and the Raft comparison path (raftpath).
//
// Operations are get, put and compare-and-swap on a single key: a put sets
// the key's value (its output carries nothing: whether it took effect shows
// in whether it returned), a get reports whether the key is present and its
// value, a CAS sets the value only when the key holds Expect (or is absent,
// with ExpectAbsent) and reports a mismatch otherwise; a CAS whose outcome
// the client never learned (Output.Unknown) may have done either. Each
// key is an independent register, so Model partitions a history by key
// (partitions in sorted key order) and porcupine checks each key alone.
// Keys start absent.
package kvmodel

import (
	"fmt"
	"sort"

	"github.com/anishathalye/porcupine"
)

// Input is one client operation on one key.
type Input struct {
	Put   bool   // a put
	CAS   bool   // a compare-and-swap; neither Put nor CAS: a get
	Key   string // the key operated on
	Value string // put, CAS: the value written
	// CAS: the value the key must hold (ExpectAbsent: the key must be
	// absent).
	Expect       string
	ExpectAbsent bool
}

// Output is what the client saw. For a get, Found/Value; for a CAS,
// Mismatch (the compare failed) or Unknown (no answer: either outcome); a
// put's output is the zero Output.
type Output struct {
	Found    bool
	Value    string
	Mismatch bool
	Unknown  bool
}

// state is one key's value.
type state struct {
	found bool
	value string
}

// Model is a register per key over Input/Output operations; histories are
// partitioned by key.
var Model = porcupine.Model{
	Partition: partition,
	Init:      func() any { return state{} },
	Step: func(st, input, output any) (bool, any) {
		s, in, out := st.(state), input.(Input), output.(Output)
		if in.Put {
			return true, state{found: true, value: in.Value}
		}
		if in.CAS {
			match := (in.ExpectAbsent && !s.found) || (!in.ExpectAbsent && s.found && s.value == in.Expect)
			next := s
			if match {
				next = state{found: true, value: in.Value}
			}
			return out.Unknown || out.Mismatch != match, next
		}
		return out.Found == s.found && out.Value == s.value, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(Input), output.(Output)
		if in.Put {
			return fmt.Sprintf("put(%s, %s)", in.Key, in.Value)
		}
		if in.CAS {
			expect := in.Expect
			if in.ExpectAbsent {
				expect = "absent"
			}
			result := "ok"
			switch {
			case out.Unknown:
				result = "unknown"
			case out.Mismatch:
				result = "mismatch"
			}
			return fmt.Sprintf("cas(%s, %s -> %s) -> %s", in.Key, expect, in.Value, result)
		}
		if !out.Found {
			return fmt.Sprintf("get(%s) -> absent", in.Key)
		}
		return fmt.Sprintf("get(%s) -> %s", in.Key, out.Value)
	},
}

// partition splits history by key, keeping each key's operations in
// history order, partitions in sorted key order.
func partition(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range history {
		k := op.Input.(Input).Key
		byKey[k] = append(byKey[k], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}
