package accel

import (
	"synod/paxos"
	"synod/pmem"
)

// WAL is where the accept fast path makes an accepted entry durable before
// it lets the Accepted out. *pmem.Log satisfies it.
type WAL interface {
	Append([]pmem.Record) error
	Persist() error
}

// Promiser is the optional part of a WAL that stores the promised ballot
// (*pmem.Log has it). When the fast path accepts a ballot above the
// promised register, accepting is promising: with a Promiser the promise
// is made durable first, without one such an Accept is handed up.
type Promiser interface {
	SetPromised(pmem.Ballot) error
}

var (
	_ WAL      = (*pmem.Log)(nil)
	_ Promiser = (*pmem.Log)(nil)
)

func pmemBallot(b paxos.Ballot) pmem.Ballot {
	return pmem.Ballot{Round: b.Round, Node: uint64(b.Node)}
}

func walEntry(slot paxos.Slot, b paxos.Ballot, payload []byte) pmem.Record {
	return pmem.Record{Type: pmem.RecordEntry, Slot: uint64(slot), Ballot: pmemBallot(b), Payload: payload}
}
