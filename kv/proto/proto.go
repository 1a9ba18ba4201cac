// Package proto is synod's binary client protocol: length-prefixed frames
// over TCP, each with a fixed-size header that can be decoded (and shaped by
// tenant, opcode and size) before the body is read.
//
// Frame layout (all integers big-endian; the constants below are part of the
// wire format and must not change without bumping Version):
//
//	offset size field
//	0      4    length      body bytes that follow the header (not counting the header)
//	4      1    opcode      Opcode
//	5      1    flags       Flags (FlagResponse on every response)
//	6      1    status      Status (responses; 0 in requests)
//	7      1    reserved    must be 0
//	8      4    tenant      tenants.ID (0 only in HELLO requests)
//	12     8    request id  chosen by the client, echoed in the response
//	20     ...  body        opcode- and status-specific, see docs/protocol.md
//
// Requests are pipelined: a client may have up to InflightPerConnMax
// requests outstanding on a connection, and responses may come back in any
// order; the request id matches them.
package proto

import (
	"encoding/binary"
	"errors"
	"fmt"

	"synod/tenants"
)

// Version is the protocol version exchanged in HELLO.
const Version uint16 = 1

// HeaderBytes is the size of the fixed frame header.
const HeaderBytes = 20

// The size chain. Every size limit of a write is derived from the one below
// it, down to the acceptor-log record a write must fit in, so that no write
// a client may send can fail to fit on its way down:
//
//	pmem.RecordBytesMax                1,048,576  one acceptor-log record, header and padding included
//	 - pmem record header (56)         1,048,520  record payload: one paxos entry (paxos.AppendEntry)
//	 - paxos entry header (29)
//	 - one command length (4)          1,048,487  one command envelope (kv/replica)
//	 - envelope header (25)            1,048,462  CommandBytesMax: one state-machine command (kv/sm)
//	 - command header (6)              1,048,456  RequestBodyBytesMax: one write request body
//	 - write identity (24), key length (2), KeyBytesMax (1024),
//	   value length (4)                1,047,402  ValueBytesMax: a PUT of the longest key
//
// CommandBytesMax is stated here, where clients can see it, and derived in
// kv/replica/limits.go from pmem's and paxos's constants; a compile-time
// check there fails if the two disagree (as does one in kv/sm for the
// command header). A slot that batches several commands stays far below
// the record (paxos.SlotBytesMax), which kv/replica checks the same way.
//
// Where a request enters: a frame whose body exceeds RequestBodyBytesMax is
// answered TOO_LARGE without being buffered (the connection stays open), a
// key or value over its limit is TOO_LARGE when decoded, and a CAS or BATCH
// whose parts are each within limits but together exceed
// RequestBodyBytesMax is TOO_LARGE by its frame length. The replica checks
// the encoded command once more before proposing it.
const (
	CommandBytesMax     = 1048462
	CommandHeaderBytes  = 6 // kv/sm: version u8, tenant u32, opcode u8
	RequestBodyBytesMax = CommandBytesMax - CommandHeaderBytes
	// writeIDBytes is a write's (client id, seq, first unacked).
	writeIDBytes = 3 * 8
)

// Limits. They are part of the protocol contract: a peer that exceeds one
// gets TOO_LARGE (sizes) or BAD_REQUEST (counts), never a partial result.
const (
	KeyBytesMax = 1024 // longest key
	// ScanStartBytesMax bounds a SCAN's start: one byte more than a key,
	// so that the last key of a page followed by a zero byte (its
	// successor) always resumes the scan, a key of KeyBytesMax included
	// (a 1025-byte start was TOO_LARGE, and a client had to compute a
	// successor of its own: an outside tester).
	ScanStartBytesMax = KeyBytesMax + 1
	// ValueBytesMax is the longest value: a PUT of it under a key of
	// KeyBytesMax is exactly RequestBodyBytesMax (1 MiB less 1,174 bytes
	// of headers down to the acceptor-log record).
	ValueBytesMax = RequestBodyBytesMax - writeIDBytes - 2 - KeyBytesMax - 4
	// RequestFrameBytesMax is the longest request frame, header included
	// (HELLO reports it).
	RequestFrameBytesMax = HeaderBytes + RequestBodyBytesMax
	// FrameBytesMax is the longest frame a peer may announce at all,
	// header included (4 MiB); a request frame between RequestFrameBytesMax
	// and it is skipped and answered TOO_LARGE, a longer one ends the
	// connection. Responses (SCAN) stay below it.
	FrameBytesMax      = 4 << 20
	InflightPerConnMax = 256     // requests outstanding on one connection
	ScanLimitMax       = 1000    // most pairs one SCAN returns
	ScanReplyBytesMax  = 2 << 20 // a SCAN stops early (More=true) past this many key+value bytes
	BatchOpsMax        = 128     // operations in one BATCH
	TokenBytesMax      = tenants.TokenBytesMax
	MessageBytesMax    = 1024 // error message text in a response
	AddrBytesMax       = 255  // a leader or member address
	MembersMax         = 16   // members in a STATUS reply
	bodyBytesMax       = FrameBytesMax - HeaderBytes
)

// Opcode names the operation a frame carries.
type Opcode uint8

// Opcodes. Values are part of the wire format.
const (
	// OpNone appears only in error responses to a frame whose opcode the
	// server could not read.
	OpNone   Opcode = 0
	OpHello  Opcode = 1 // handshake: token -> tenant id
	OpPing   Opcode = 2 // liveness; answered by the server itself
	OpGet    Opcode = 3
	OpPut    Opcode = 4
	OpDelete Opcode = 5
	OpCAS    Opcode = 6 // compare-and-swap on one key
	OpScan   Opcode = 7 // range scan within the tenant, with a limit
	OpBatch  Opcode = 8 // atomic multi-key write
	OpStatus Opcode = 9 // cluster and member status (kvctl status)
	// Membership operations (member.go): operator requests carrying the
	// admin token, executed by the leader.
	OpMemberList     Opcode = 10
	OpMemberAdd      Opcode = 11 // add a learner
	OpMemberRemove   Opcode = 12
	OpMemberPromote  Opcode = 13 // learner -> voter
	OpTransferLeader Opcode = 14
)

var opNames = [...]string{OpNone: "NONE", OpHello: "HELLO", OpPing: "PING", OpGet: "GET", OpPut: "PUT",
	OpDelete: "DELETE", OpCAS: "CAS", OpScan: "SCAN", OpBatch: "BATCH", OpStatus: "STATUS",
	OpMemberList: "MEMBER_LIST", OpMemberAdd: "MEMBER_ADD", OpMemberRemove: "MEMBER_REMOVE",
	OpMemberPromote: "MEMBER_PROMOTE", OpTransferLeader: "TRANSFER_LEADER"}

func (o Opcode) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// Valid reports whether o is a known opcode.
func (o Opcode) Valid() bool { return o >= OpHello && o <= OpTransferLeader }

// IsWrite reports whether o changes state and therefore carries a
// (client id, sequence) pair for exactly-once application.
func (o Opcode) IsWrite() bool { return o == OpPut || o == OpDelete || o == OpCAS || o == OpBatch }

// Flags modify a frame.
type Flags uint8

const (
	// FlagResponse marks a frame sent by the server.
	FlagResponse Flags = 1 << 0
	// FlagStaleOK on a GET or SCAN lets any replica answer from its applied
	// state without the linearizable read path.
	FlagStaleOK Flags = 1 << 1

	flagsKnown = FlagResponse | FlagStaleOK
)

// Status is the outcome carried in a response header.
type Status uint8

// Statuses. Values are part of the wire format.
const (
	StatusOK            Status = 0
	StatusNotFound      Status = 1  // GET of an absent key
	StatusCASMismatch   Status = 2  // CAS (or a CAS inside a BATCH) found another value
	StatusNotLeader     Status = 3  // retry at Response.Leader when it is not empty
	StatusThrottled     Status = 4  // tenant over budget; retry after Response.RetryAfter
	StatusTooLarge      Status = 5  // key, value or frame over its limit
	StatusBadRequest    Status = 6  // malformed or inconsistent request
	StatusUnauthorized  Status = 7  // bad token, or a tenant id other than the authenticated one
	StatusUnavailable   Status = 8  // no quorum, shutting down, timed out: retry later
	StatusSequenceStale Status = 9  // write (client, seq) older than what the server remembers
	StatusInternal      Status = 10 // server-side failure (storage error); not retried by clients
	// StatusConflict: a membership operation conflicts with what the
	// cluster is doing (a change or a leadership transfer in progress, a
	// learner not caught up): nothing was done; retry later.
	StatusConflict Status = 11
	// StatusNoSpace: the write would take the tenant past its storage
	// quota, or the node's disk has less free space than its reserve
	// (docs/protocol.md, "Storage quotas"). Nothing was written; delete
	// something, or have the operator raise the quota or free the disk.
	// Deletes are never refused for space.
	StatusNoSpace Status = 12
)

var statusNames = [...]string{StatusOK: "OK", StatusNotFound: "NOT_FOUND", StatusCASMismatch: "CAS_MISMATCH",
	StatusNotLeader: "NOT_LEADER", StatusThrottled: "THROTTLED", StatusTooLarge: "TOO_LARGE",
	StatusBadRequest: "BAD_REQUEST", StatusUnauthorized: "UNAUTHORIZED", StatusUnavailable: "UNAVAILABLE",
	StatusSequenceStale: "SEQUENCE_STALE", StatusInternal: "INTERNAL", StatusConflict: "CONFLICT",
	StatusNoSpace: "NO_SPACE"}

func (s Status) String() string {
	if int(s) < len(statusNames) && statusNames[s] != "" {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Valid reports whether s is a known status.
func (s Status) Valid() bool { return s <= StatusNoSpace }

// Header is the fixed-size part of every frame.
type Header struct {
	Length uint32 // body bytes after the header
	Op     Opcode
	Flags  Flags
	Status Status
	Tenant tenants.ID
	ID     uint64
}

// Errors returned by the decoders. Every decoding failure wraps ErrMalformed.
var (
	ErrMalformed = errors.New("proto: malformed frame")
	ErrTooLarge  = errors.New("proto: frame too large")
)

// AppendHeader appends h's wire form to b.
func AppendHeader(b []byte, h Header) []byte {
	b = binary.BigEndian.AppendUint32(b, h.Length)
	b = append(b, byte(h.Op), byte(h.Flags), byte(h.Status), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(h.Tenant))
	return binary.BigEndian.AppendUint64(b, h.ID)
}

// DecodeHeader decodes the fixed header from the first HeaderBytes of b and
// checks what can be checked without the body: the length limit, a known
// opcode, known flags, a zero reserved byte. A length over the limit returns
// an error wrapping ErrTooLarge (the header is still returned so the caller
// can answer with the request id).
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderBytes {
		return Header{}, fmt.Errorf("%w: header needs %d bytes, have %d", ErrMalformed, HeaderBytes, len(b))
	}
	h := Header{
		Length: binary.BigEndian.Uint32(b[0:4]),
		Op:     Opcode(b[4]),
		Flags:  Flags(b[5]),
		Status: Status(b[6]),
		Tenant: tenants.ID(binary.BigEndian.Uint32(b[8:12])),
		ID:     binary.BigEndian.Uint64(b[12:20]),
	}
	switch {
	case h.Length > bodyBytesMax:
		return h, fmt.Errorf("%w: body of %d bytes exceeds %d", ErrTooLarge, h.Length, bodyBytesMax)
	case !h.Op.Valid() && !(h.Op == OpNone && h.Flags&FlagResponse != 0):
		return h, fmt.Errorf("%w: unknown opcode %d", ErrMalformed, b[4])
	case h.Flags&^flagsKnown != 0:
		return h, fmt.Errorf("%w: unknown flags %#x", ErrMalformed, b[5])
	case b[7] != 0:
		return h, fmt.Errorf("%w: reserved byte is %#x", ErrMalformed, b[7])
	case !h.Status.Valid():
		return h, fmt.Errorf("%w: unknown status %d", ErrMalformed, b[6])
	}
	return h, nil
}
