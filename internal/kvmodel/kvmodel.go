// Package kvmodel is the porcupine linearizability model of synod's
// client-level key-value operations, shared by the end-to-end tests (e2e)
// and the Raft comparison path (raftpath).
//
// Operations are get and put on a single key: a put sets the key's value
// (its output carries nothing: whether it took effect shows in whether it
// returned), a get reports whether the key is present and its value. Each
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
	Put   bool   // a put; otherwise a get
	Key   string // the key operated on
	Value string // put: the value written
}

// Output is what the client saw. For a get, Found/Value; a put's output is
// the zero Output.
type Output struct {
	Found bool
	Value string
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
		return out.Found == s.found && out.Value == s.value, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(Input), output.(Output)
		if in.Put {
			return fmt.Sprintf("put(%s, %s)", in.Key, in.Value)
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
