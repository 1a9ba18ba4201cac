package replica

import "synod/paxos"

// entryPayload is e's record payload in a buffer of its own (the adapter
// encodes into its reused buffer: appendEntryPayload).
func entryPayload(e *paxos.Entry) []byte {
	return appendEntryPayload(make([]byte, 0, entryPayloadSize(e)), e)
}

// sealSide returns the side-channel frame of payload in fresh buffers (the
// send loop seals into its own: sealSideTo).
func (a *Auth) sealSide(payload []byte) []byte {
	return a.sealSideTo(&sideBufs{}, payload)
}
