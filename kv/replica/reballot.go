package replica

import (
	"encoding/binary"
	"fmt"

	"synod/paxos"
	"synod/pmem"
)

// Re-ballot records in the acceptor log (paxos reballot.go): a value
// stored again under a new ballot is recorded as the new ballot alone,
// naming the ballot of the record that holds the value. The payload:
//
//	slot u64 | ballot round u64 | ballot node u64 | 0xB0 | type u8 | held round u64 | held node u64
//
// (little-endian, 42 bytes: one 128-byte ring record, against 256 KiB for
// the value again). Its first 25 bytes are laid out as an entry's, and
// 0xB0 sits where an entry has its type: a binary that predates
// re-ballots fails to decode the record ("unknown entry type 176") and
// refuses to recover the log, rather than skip it and forget the ballot.
const (
	reballotMarker       = 0xB0
	reballotPayloadBytes = 8 + 16 + 1 + 1 + 16
)

// reballotRingBytes is the ring space of a re-ballot record: admission
// counts it for an entry whose value the node holds (paxos HoldsValue).
var reballotRingBytes = pmem.RecordBytes(reballotPayloadBytes)

// entryPayloadSize is the length of e's record payload.
func entryPayloadSize(e *paxos.Entry) int {
	if e.Held.IsZero() {
		return paxos.EntrySize(e)
	}
	return reballotPayloadBytes
}

// appendEntryPayload appends e's record payload to b: a re-ballot when
// e.Held is set, the entry's encoding otherwise.
func appendEntryPayload(b []byte, e *paxos.Entry) []byte {
	if e.Held.IsZero() {
		return paxos.AppendEntry(b, e)
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(e.Slot))
	b = binary.LittleEndian.AppendUint64(b, e.Ballot.Round)
	b = binary.LittleEndian.AppendUint64(b, uint64(e.Ballot.Node))
	b = append(b, reballotMarker, byte(e.Type))
	b = binary.LittleEndian.AppendUint64(b, e.Held.Round)
	return binary.LittleEndian.AppendUint64(b, uint64(e.Held.Node))
}

// decodeReballot decodes a re-ballot payload: the entry without commands,
// with Held set; ok false when b is not one (an entry's encoding).
func decodeReballot(b []byte) (e paxos.Entry, ok bool) {
	if len(b) != reballotPayloadBytes || b[24] != reballotMarker {
		return paxos.Entry{}, false
	}
	e.Slot = paxos.Slot(binary.LittleEndian.Uint64(b[0:]))
	e.Ballot = paxos.Ballot{Round: binary.LittleEndian.Uint64(b[8:]), Node: paxos.NodeID(binary.LittleEndian.Uint64(b[16:]))}
	e.Type = paxos.EntryType(b[25])
	e.Held = paxos.Ballot{Round: binary.LittleEndian.Uint64(b[26:]), Node: paxos.NodeID(binary.LittleEndian.Uint64(b[34:]))}
	return e, !e.Held.IsZero()
}

// resolveReballot applies re-ballot rb to latest, the last record of each
// slot read so far in log order: the value of the slot's record under
// rb.Held takes rb's ballot. A record under a later ballot than rb's
// stands (the accel fast path appends beside the consensus loop, so a
// later ballot can be recorded first); a re-ballot naming a record the
// log does not hold is an error (Append's order rules it out: the named
// record came first).
func resolveReballot(latest map[paxos.Slot]paxos.Entry, rb paxos.Entry) error {
	base, held := latest[rb.Slot]
	if held && rb.Ballot.Less(base.Ballot) {
		return nil
	}
	if !held || base.Ballot != rb.Held || base.Type != rb.Type {
		return fmt.Errorf("the re-ballot of slot %d under %v names ballot %v, but the log holds %v for the slot (held %v, type %d)",
			rb.Slot, rb.Ballot, rb.Held, base.Ballot, held, base.Type)
	}
	base.Ballot = rb.Ballot
	latest[rb.Slot] = base
	return nil
}
