package replica

import (
	"encoding/binary"
	"errors"

	"synod/paxos"
)

// A proposed command travels in an envelope that names the node that
// proposed it and the proposal id there, so the apply loop of that node can
// answer the waiting writer. Layout (little endian):
//
//	offset size field
//	0      1    envelopeVersion
//	1      8    origin node id
//	9      8    proposal id
//	17     ...  command bytes (opaque to the runtime)
//
// The layout is part of the replicated log format.
const (
	envelopeVersion     = 1
	envelopeHeaderBytes = 17
)

var errBadEnvelope = errors.New("replica: malformed command envelope")

// appendEnvelope appends the envelope of cmd to buf.
func appendEnvelope(buf []byte, origin paxos.NodeID, id uint64, cmd []byte) []byte {
	buf = append(buf, envelopeVersion)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(origin))
	buf = binary.LittleEndian.AppendUint64(buf, id)
	return append(buf, cmd...)
}

// parseEnvelope splits an envelope; cmd aliases b.
func parseEnvelope(b []byte) (origin paxos.NodeID, id uint64, cmd []byte, err error) {
	if len(b) < envelopeHeaderBytes || b[0] != envelopeVersion {
		return 0, 0, nil, errBadEnvelope
	}
	origin = paxos.NodeID(binary.LittleEndian.Uint64(b[1:9]))
	id = binary.LittleEndian.Uint64(b[9:17])
	return origin, id, b[envelopeHeaderBytes:], nil
}
