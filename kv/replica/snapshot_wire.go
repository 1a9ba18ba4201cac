package replica

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"synod/kv/sm"
	"synod/paxos"
)

// Snapshot transfers. Paxos deals only in snapshot metadata: a node that
// lags below a peer's compaction point is offered a snapshot
// (paxos.SnapshotOffer), fetches the state from that peer over TCP, stages
// it chunk by chunk (sm.BeginStage), and only when the staged copy is
// complete and verified tells paxos (InstallSnapshot), whose Ready then has
// the apply loop swap it in. No snapshot is ever held whole in memory and
// there is no size limit.
//
// A transfer uses its own TCP connection to the peer's consensus address
// (the side channel's port). The fetcher writes snapshotConnMagic, which no
// side-channel frame can begin with (its first four bytes are a length of
// at most sideFrameBytesMax), then one request frame; the server answers
// with a header frame (the snapshot's metadata), chunk frames, and an end
// frame, or a refuse frame. With authentication every frame is sealed on
// authChannelSnapshot exactly as side-channel frames are on
// authChannelSide (auth.go): its head is authenticated before its body is
// read, its body then against the whole tag and the replay window; so only
// a member can ask for a snapshot (it holds every tenant's data), a
// request cannot be replayed, and a chunk cannot be forged, replayed or
// moved between transfers. Without authentication (in-process tests) a
// frame is a 4-byte length and the payload.
//
// Frame payloads (little endian; every transfer id is the fetcher's):
//
//	kind u8 | version u8 = 1 | transfer id u64 | by kind:
//	  request (7): from u64 | to u64 | commit u64  (the fetcher, the server, the fetcher's commit index)
//	  delta request (8): from u64 | to u64 | commit u64 | digest (at most sm.DeltaDigestBytesMax)
//	  request of an earlier version (1, refused): from u64 | commit u64
//	  delta request of an earlier version (6, refused): from u64 | commit u64 | digest
//	  header:  snapshot metadata (paxos.AppendSnapshotMeta)
//	  chunk:   seq u64 | data (at most snapshotChunkBytesMax)
//	  end:     chunks u64 | bytes u64
//	  refuse:  reason u8
//
// The data of the chunks, concatenated, is the state machine's snapshot
// stream (kv/sm), or its delta stream for a delta request (the fetcher's
// digest: the ranges and hashes of its own state; the server sends only
// the ranges that differ: kv/sm "Delta snapshots"), which carries its own
// record count and checksum; the
// fetcher checks every chunk's transfer id and sequence number and the end
// frame's totals, so a lost, repeated or reordered chunk fails the
// transfer. TCP is the flow control: the server writes a chunk only when
// the socket takes it, the fetcher reads one only when the last is staged.
// Either side gives up after snapshotStallTimeout without progress.
const (
	// snapshotConnMagic opens a transfer connection ("SNP1", little endian;
	// above any side-channel frame length).
	snapshotConnMagic = 0x31504E53
	// snapshotChunkBytesMax bounds the state bytes of one chunk frame.
	snapshotChunkBytesMax = 1 << 20
	// snapshotFrameBytesMax bounds one transfer frame's payload: a chunk
	// and its fields, or a header with MembersMax members.
	snapshotFrameBytesMax = snapshotChunkBytesMax + 64 + 8*paxos.MembersMax
	// snapshotStallTimeout is how long a transfer may go without a frame
	// read (fetcher) or written (server) before it fails.
	snapshotStallTimeout = 10 * time.Second
	// snapshotServesMax bounds the transfers one node serves at once; each
	// holds a Pebble snapshot (which pins old data) and a stream buffer.
	snapshotServesMax = 2
	// snapshotFetchesMax is how many transfers a node fetches at once: one
	// (there is one staging directory).
	snapshotFetchesMax = 1
	// snapshotMetaWait bounds how long a server waits for its consensus
	// loop to stamp a snapshot with its metadata.
	snapshotMetaWait = 5 * time.Second
	// snapshotRetainAfter is how long after a transfer ended its server
	// keeps the log above the snapshot's slot (so the fetcher catches up
	// from the log instead of needing another snapshot), while its
	// acceptor log is below snapshotRetainLogPercentMax.
	snapshotRetainAfter = 30 * time.Second
	// snapshotRetainLogPercentMax: above this share of the acceptor log in
	// use, compaction ignores transfers' retention (the log must not fill
	// for a laggard; the laggard then fetches again). Below the line where
	// a leader stops taking proposals (100 - logReservePercent, limits.go):
	// at or above it a held leader would wait for a truncation the pins
	// refuse, until the transfer ended.
	snapshotRetainLogPercentMax = 60
	// snapshotInstallRetry is how long a fetcher waits before asking its
	// consensus loop again to install (a Ready stalled on a full log, or a
	// full control queue).
	snapshotInstallRetry = 20 * time.Millisecond
)

// A delta request's digest fits a frame.
var _ [snapshotFrameBytesMax - (snapFrameHeadBytes + 24 + sm.DeltaDigestBytesMax)]struct{}

// snapshotChunkBytes is the chunk size servers use (tests make it small).
var snapshotChunkBytes = snapshotChunkBytesMax

// Frame kinds and the payload version.
const (
	snapFrameRequest = 1
	snapFrameHeader  = 2
	snapFrameChunk   = 3
	snapFrameEnd     = 4
	snapFrameRefuse  = 5
	// snapFrameDeltaRequest asks for a delta stream (a server of an
	// earlier version refuses the frame: the fetcher then asks for a whole
	// stream next time).
	snapFrameDeltaRequest = 6
	// snapFrameAddressedRequest and snapFrameAddressedDeltaRequest are
	// the requests this version sends: they name the server, which
	// refuses a request addressed to another node. The seal does not
	// name the receiver and a sender's counter runs across its receivers,
	// so without the name a request captured on its way to one member
	// could be replayed to another, which would serve its whole store.
	// A server refuses the two unaddressed kinds of the version before
	// (they decode, with to 0, so that the refusal can say why), and a
	// request that names server 0.
	snapFrameAddressedRequest      = 7
	snapFrameAddressedDeltaRequest = 8

	snapFrameVersion   = 1
	snapFrameHeadBytes = 1 + 1 + 8
)

// Refusal reasons.
const (
	snapRefuseBusy    = 1 // snapshotServesMax transfers are running
	snapRefuseNoState = 2 // the server cannot stamp its state (try later)
	snapRefuseBadReq  = 3 // the request's digest does not decode
)

var (
	errSnapFrame   = errors.New("replica: malformed snapshot transfer frame")
	errSnapRefused = errors.New("replica: snapshot transfer refused")
	errSnapStale   = errors.New("replica: snapshot transfer stale")
	// errSnapMisaddressed refuses a request that names another server (a
	// replay of a request captured on its way to another member).
	errSnapMisaddressed = errors.New("replica: snapshot request addressed to another node (a replay of another node's traffic?)")
)

// snapFrame is one decoded transfer frame.
type snapFrame struct {
	kind   byte
	id     uint64
	from   paxos.NodeID // request
	to     paxos.NodeID // request (0: an unaddressed request of an earlier version)
	commit uint64       // request
	digest []byte       // delta request (aliases the decoded buffer)
	meta   paxos.SnapshotMeta
	seq    uint64 // chunk; end: chunks
	bytes  uint64 // end
	data   []byte // chunk (aliases the decoded buffer)
	reason byte   // refuse
}

func appendSnapHead(b []byte, kind byte, id uint64) []byte {
	b = append(b, kind, snapFrameVersion)
	return binary.LittleEndian.AppendUint64(b, id)
}

// appendSnapRequest encodes from's request to node to for a whole stream.
func appendSnapRequest(b []byte, id uint64, from, to paxos.NodeID, commit uint64) []byte {
	b = appendSnapHead(b, snapFrameAddressedRequest, id)
	b = binary.LittleEndian.AppendUint64(b, uint64(from))
	b = binary.LittleEndian.AppendUint64(b, uint64(to))
	return binary.LittleEndian.AppendUint64(b, commit)
}

// appendSnapDeltaRequest encodes from's request to node to for a delta
// stream against digest.
func appendSnapDeltaRequest(b []byte, id uint64, from, to paxos.NodeID, commit uint64, digest []byte) []byte {
	b = appendSnapHead(b, snapFrameAddressedDeltaRequest, id)
	b = binary.LittleEndian.AppendUint64(b, uint64(from))
	b = binary.LittleEndian.AppendUint64(b, uint64(to))
	b = binary.LittleEndian.AppendUint64(b, commit)
	return append(b, digest...)
}

// isSnapRequest reports whether kind is one of the four request kinds.
func isSnapRequest(kind byte) bool {
	switch kind {
	case snapFrameRequest, snapFrameDeltaRequest, snapFrameAddressedRequest, snapFrameAddressedDeltaRequest:
		return true
	}
	return false
}

func appendSnapHeader(b []byte, id uint64, meta *paxos.SnapshotMeta) []byte {
	return paxos.AppendSnapshotMeta(appendSnapHead(b, snapFrameHeader, id), meta)
}

func appendSnapChunk(b []byte, id, seq uint64, data []byte) []byte {
	b = appendSnapHead(b, snapFrameChunk, id)
	b = binary.LittleEndian.AppendUint64(b, seq)
	return append(b, data...)
}

func appendSnapEnd(b []byte, id, chunks, bytes uint64) []byte {
	b = appendSnapHead(b, snapFrameEnd, id)
	b = binary.LittleEndian.AppendUint64(b, chunks)
	return binary.LittleEndian.AppendUint64(b, bytes)
}

func appendSnapRefuse(b []byte, id uint64, reason byte) []byte {
	return append(appendSnapHead(b, snapFrameRefuse, id), reason)
}

// decodeSnapFrame decodes one frame payload (malformed input is an error,
// never a panic; chunk data aliases b).
func decodeSnapFrame(b []byte) (snapFrame, error) {
	var f snapFrame
	if len(b) > snapshotFrameBytesMax {
		return f, fmt.Errorf("%w: %d bytes", errSnapFrame, len(b))
	}
	if len(b) < snapFrameHeadBytes || b[1] != snapFrameVersion {
		return f, fmt.Errorf("%w: short or unknown version", errSnapFrame)
	}
	f.kind, f.id = b[0], binary.LittleEndian.Uint64(b[2:])
	rest := b[snapFrameHeadBytes:]
	u64 := func(i int) uint64 { return binary.LittleEndian.Uint64(rest[8*i:]) }
	switch f.kind {
	case snapFrameRequest:
		if len(rest) != 16 {
			return f, fmt.Errorf("%w: request of %d bytes", errSnapFrame, len(rest))
		}
		f.from, f.commit = paxos.NodeID(u64(0)), u64(1)
	case snapFrameDeltaRequest:
		if len(rest) <= 16 || len(rest)-16 > sm.DeltaDigestBytesMax {
			return f, fmt.Errorf("%w: delta request of %d bytes", errSnapFrame, len(rest))
		}
		f.from, f.commit, f.digest = paxos.NodeID(u64(0)), u64(1), rest[16:]
	case snapFrameAddressedRequest:
		if len(rest) != 24 {
			return f, fmt.Errorf("%w: request of %d bytes", errSnapFrame, len(rest))
		}
		f.from, f.to, f.commit = paxos.NodeID(u64(0)), paxos.NodeID(u64(1)), u64(2)
		if f.to == 0 {
			return f, fmt.Errorf("%w: request to node 0", errSnapFrame)
		}
	case snapFrameAddressedDeltaRequest:
		if len(rest) <= 24 || len(rest)-24 > sm.DeltaDigestBytesMax {
			return f, fmt.Errorf("%w: delta request of %d bytes", errSnapFrame, len(rest))
		}
		f.from, f.to, f.commit, f.digest = paxos.NodeID(u64(0)), paxos.NodeID(u64(1)), u64(2), rest[24:]
		if f.to == 0 {
			return f, fmt.Errorf("%w: delta request to node 0", errSnapFrame)
		}
	case snapFrameHeader:
		m, err := paxos.UnmarshalSnapshotMeta(rest)
		if err != nil {
			return f, fmt.Errorf("%w: header: %v", errSnapFrame, err)
		}
		f.meta = m
	case snapFrameChunk:
		if len(rest) < 8 || len(rest)-8 > snapshotChunkBytesMax {
			return f, fmt.Errorf("%w: chunk of %d bytes", errSnapFrame, len(rest))
		}
		f.seq, f.data = u64(0), rest[8:]
	case snapFrameEnd:
		if len(rest) != 16 {
			return f, fmt.Errorf("%w: end of %d bytes", errSnapFrame, len(rest))
		}
		f.seq, f.bytes = u64(0), u64(1)
	case snapFrameRefuse:
		if len(rest) != 1 {
			return f, fmt.Errorf("%w: refuse of %d bytes", errSnapFrame, len(rest))
		}
		f.reason = rest[0]
	default:
		return f, fmt.Errorf("%w: kind %d", errSnapFrame, f.kind)
	}
	return f, nil
}

// snapConn frames one transfer connection: sealed frames under Config.Auth
// on authChannelSnapshot, or length-prefixed ones without it. Buffers are
// reused: a frame read aliases the connection's buffer until the next
// read.
type snapConn struct {
	c       net.Conn
	r       *bufio.Reader
	w       *bufio.Writer
	auth    *Auth
	rbuf    []byte
	sealing sealedFrame // reused frame after frame
	// peer is the authenticated sender of the last frame read (0 without
	// authentication).
	peer paxos.NodeID
}

func newSnapConn(c net.Conn, r *bufio.Reader, auth *Auth) *snapConn {
	if r == nil {
		r = bufio.NewReaderSize(c, 64<<10)
	}
	return &snapConn{c: c, r: r, w: bufio.NewWriterSize(c, 64<<10), auth: auth}
}

// write sends one frame payload within snapshotStallTimeout.
func (sc *snapConn) write(payload []byte) error {
	sc.c.SetWriteDeadline(time.Now().Add(snapshotStallTimeout))
	var err error
	if sc.auth != nil {
		sc.auth.sealFrame(&sc.sealing, authChannelSnapshot, payload, nil)
		err = sc.sealing.write(sc.w, payload, nil)
	} else {
		var hdr [4]byte
		binary.LittleEndian.PutUint32(hdr[:], uint32(len(payload)))
		if _, err = sc.w.Write(hdr[:]); err == nil {
			_, err = sc.w.Write(payload)
		}
	}
	if err != nil {
		return err
	}
	return sc.w.Flush()
}

// read receives one frame payload within snapshotStallTimeout. A sealed
// frame's head is authenticated before its body is read; the body is
// bounded by snapshotFrameBytesMax and read into the reused buffer.
func (sc *snapConn) read() ([]byte, error) {
	sc.c.SetReadDeadline(time.Now().Add(snapshotStallTimeout))
	if sc.auth == nil {
		var hdr [4]byte
		if _, err := io.ReadFull(sc.r, hdr[:]); err != nil {
			return nil, err
		}
		n := binary.LittleEndian.Uint32(hdr[:])
		if n > snapshotFrameBytesMax {
			return nil, fmt.Errorf("%w: frame of %d bytes", errSnapFrame, n)
		}
		sc.rbuf = grow(sc.rbuf, int(n))
		if _, err := io.ReadFull(sc.r, sc.rbuf); err != nil {
			return nil, err
		}
		return sc.rbuf, nil
	}
	var head [sideFrameHeadBytes]byte
	if _, err := io.ReadFull(sc.r, head[:]); err != nil {
		return nil, err
	}
	n, err := sc.auth.openFrameHead(head[:], authChannelSnapshot, snapshotFrameBytesMax+authOverheadBytes)
	if err != nil {
		return nil, err
	}
	sc.rbuf = grow(sc.rbuf, n)
	copy(sc.rbuf, head[4:4+authHeaderBytes])
	if _, err := io.ReadFull(sc.r, sc.rbuf[authHeaderBytes:]); err != nil {
		return nil, err
	}
	payload, sender, err := sc.auth.openFrameBody(sc.rbuf, authChannelSnapshot)
	if err != nil {
		return nil, err
	}
	sc.peer = sender
	return payload, nil
}

// grow returns b resized to n bytes, reallocating only when it must.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}
