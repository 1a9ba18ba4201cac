package replica

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"synod/paxos"
)

// A proposed command travels in an envelope that names the proposal: the
// node that proposed it, that process's boot id and the proposal's number
// there, so the apply loop of that node can answer the waiting writer.
// Layout (little endian):
//
//	offset size field
//	0      1    envelopeVersion (2)
//	1      8    origin node id
//	9      8    boot id: random, drawn once per process start, never 0
//	17     8    proposal number (counts from 1 in every process)
//	25     ...  command bytes (opaque to the runtime)
//
// The proposal number alone restarts with the process, and the log is
// re-applied after a restart (Pebble runs without its WAL), so an entry of
// an earlier life could otherwise name a writer of this one: the boot id
// makes (origin, boot, number) unique across process lifetimes, and the
// apply loop also checks that the committed command is the writer's own
// (answer).
//
// Version 1 (17-byte header, no boot id) is still parsed, with boot id 0,
// so logs written before version 2 replay; its entries never answer a
// writer. The layout is part of the replicated log format.
const (
	envelopeVersion       = 2
	envelopeHeaderBytes   = 25
	envelopeV1            = 1
	envelopeV1HeaderBytes = 17
)

var errBadEnvelope = errors.New("replica: malformed command envelope")

// proposalID names one proposal across the whole history of the group.
type proposalID struct {
	origin paxos.NodeID
	boot   uint64
	seq    uint64
}

// envelopeRoom returns a buffer of envelopeHeaderBytes, to be filled by
// putEnvelopeHeader, with room for a command of cmdBytes appended after
// it: a write's command is encoded straight into its envelope, so a value
// is not copied once more to wrap it (a 1 MB PUT's copies were half its
// leader's CPU; docs/benchmarking.md "Bytes as well as commands").
func envelopeRoom(cmdBytes int) []byte {
	return make([]byte, envelopeHeaderBytes, envelopeHeaderBytes+cmdBytes)
}

// putEnvelopeHeader writes id's envelope header into env's first
// envelopeHeaderBytes; what follows is the command.
func putEnvelopeHeader(env []byte, id proposalID) {
	_ = env[envelopeHeaderBytes-1]
	env[0] = envelopeVersion
	binary.LittleEndian.PutUint64(env[1:9], uint64(id.origin))
	binary.LittleEndian.PutUint64(env[9:17], id.boot)
	binary.LittleEndian.PutUint64(env[17:25], id.seq)
}

// parseEnvelope splits an envelope; cmd aliases b.
func parseEnvelope(b []byte) (id proposalID, cmd []byte, err error) {
	switch {
	case len(b) >= envelopeHeaderBytes && b[0] == envelopeVersion:
		id = proposalID{
			origin: paxos.NodeID(binary.LittleEndian.Uint64(b[1:9])),
			boot:   binary.LittleEndian.Uint64(b[9:17]),
			seq:    binary.LittleEndian.Uint64(b[17:25]),
		}
		return id, b[envelopeHeaderBytes:], nil
	case len(b) >= envelopeV1HeaderBytes && b[0] == envelopeV1:
		id = proposalID{
			origin: paxos.NodeID(binary.LittleEndian.Uint64(b[1:9])),
			seq:    binary.LittleEndian.Uint64(b[9:17]),
		}
		return id, b[envelopeV1HeaderBytes:], nil
	}
	return proposalID{}, nil, errBadEnvelope
}

// newBootID draws this process's boot id: 64 random bits, never 0 (0 marks
// version-1 envelopes). With TestingReusedProposalIDs it is 0 in every
// process, as if there were none.
func newBootID() (uint64, error) {
	if TestingReusedProposalIDs {
		return 0, nil
	}
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("drawing the boot id: %w", err)
		}
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 {
			return id, nil
		}
	}
}
