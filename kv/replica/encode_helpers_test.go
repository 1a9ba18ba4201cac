package replica

import (
	"encoding/binary"

	"synod/paxos"
)

// entryPayload is e's record payload in a buffer of its own (the adapter
// encodes into its reused buffer: appendEntryPayload).
func entryPayload(e *paxos.Entry) []byte {
	return appendEntryPayload(make([]byte, 0, entryPayloadSize(e)), e)
}

// send is sendParts of a message in one buffer.
func (s *sideChannel) send(id paxos.NodeID, b []byte) { s.sendParts(id, b, nil) }

// sealSide returns the side-channel frame of payload in one buffer (the
// send loop writes its parts: sealFrame).
func (a *Auth) sealSide(payload []byte) []byte {
	var f sealedFrame
	a.sealFrame(&f, authChannelSide, payload, nil)
	return f.bytes(payload)
}

// bytes is the frame f sealed around payload, in one buffer.
func (f *sealedFrame) bytes(payload []byte) []byte {
	return append(append(append([]byte(nil), f.head[:]...), payload...), f.tag[:]...)
}

// frameSealed appends to dst the stream frame (side channel, snapshot
// transfers) of sealed, a packet this node sealed on a stream channel
// (seal): the reference sealFrame must equal byte for byte
// (TestSealFrameEqualsReference).
func (a *Auth) frameSealed(dst, sealed []byte) []byte {
	start := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(sealed)))
	dst = append(dst, sealed[:authHeaderBytes]...)
	dst = binary.LittleEndian.AppendUint64(dst, a.keys[0][a.self].Sum64(dst[start:]))
	return append(dst, sealed[authHeaderBytes:]...)
}
