package proto

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"synod/tenants"
)

// Request is a decoded client request. Which fields are meaningful depends
// on Op; see docs/protocol.md for each body layout. Byte slices returned by
// DecodeRequest alias the frame buffer.
type Request struct {
	Op     Opcode
	Flags  Flags
	Tenant tenants.ID // 0 in HELLO; afterwards the authenticated tenant
	ID     uint64     // request id, echoed in the response

	// HELLO
	Version uint16
	Token   string

	// Writes (PUT, DELETE, CAS, BATCH): exactly-once identity. Seq starts at
	// 1 and grows by one per write of this client. FirstUnacked is the
	// lowest sequence the client has not yet seen answered (Seq itself at
	// most): the server may forget results of every lower sequence.
	ClientID     uint64
	Seq          uint64
	FirstUnacked uint64

	// GET, PUT, DELETE, CAS
	Key []byte
	// PUT: the new value. CAS: the value to store on a match.
	Value []byte
	// CAS: the expected current value; ExpectPresent false means "the key
	// must be absent" and Expect is then empty. With ExpectDigest, Expect
	// is the SHA-256 of the expected value (ExpectDigestBytes), so a
	// condition on a value of any size costs 32 bytes (ExpectDigest
	// requires ExpectPresent).
	ExpectPresent bool
	ExpectDigest  bool
	Expect        []byte

	// SCAN: keys in [Start, End) of the tenant; an empty End means "to the
	// end of the tenant's keyspace". Limit in 1..ScanLimitMax.
	Start, End []byte
	Limit      uint32

	// BATCH: applied atomically, all or nothing.
	Ops []BatchOp

	// STATUS: the reply format asked for: 0 (an empty body) or
	// StatusFormatBasic for the basic reply, StatusFormatProgress for the
	// progress extension too (status_ext.go).
	StatusFormat uint8

	// Membership operations (member.go): the operator's admin token, the
	// member concerned, and for MEMBER_ADD its addresses.
	AdminToken    string
	MemberID      uint64
	ConsensusAddr string
	ClientAddr    string
}

// BatchOp is one operation of a BATCH: OpPut, OpDelete or OpCAS. A CAS
// inside a batch is a condition plus a write: if any condition fails the
// whole batch is rejected with CAS_MISMATCH and Response.FailedOp names the
// first failing operation. Conditions are evaluated against the state
// before the batch.
type BatchOp struct {
	Op            Opcode
	Key           []byte
	Value         []byte
	ExpectPresent bool
	ExpectDigest  bool
	Expect        []byte
}

// The CAS expect byte (wire): what the condition compares.
const (
	expectAbsent = 0 // the key must be absent; expect is empty
	expectValue  = 1 // the key holds exactly expect
	expectDigest = 2 // the key holds a value whose SHA-256 is expect
)

// SeqMax is the largest seq a write may carry. 0 and 2^64-1 are reserved:
// a client's tombstone, kept when its exactly-once entry is evicted, is
// one above its highest seq, and one above 2^64-1 wraps to 0, below
// which nothing is stale: an outside tester's retry of a write with seq
// 2^64-1, re-sent after its entry was evicted, applied a second time.
const SeqMax = 1<<64 - 2

// ExpectDigestBytes is the length of a digest condition's expect field.
const ExpectDigestBytes = sha256.Size

// ValueDigest is the digest a CAS with ExpectDigest compares: SHA-256 of
// the value.
func ValueDigest(value []byte) []byte {
	d := sha256.Sum256(value)
	return d[:]
}

// keyOp is the key-level part of PUT, DELETE and CAS.
type keyOp struct {
	key, value    []byte
	expectPresent bool
	expectDigest  bool
	expect        []byte
}

// AppendRequest appends the complete frame (header and body) for req.
func AppendRequest(b []byte, req *Request) []byte {
	start := len(b)
	b = AppendHeader(b, Header{Op: req.Op, Flags: req.Flags &^ FlagResponse, Tenant: req.Tenant, ID: req.ID})
	b = AppendRequestBody(b, req)
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-HeaderBytes))
	return b
}

// AppendRequestBody appends only req's body.
func AppendRequestBody(b []byte, req *Request) []byte {
	switch req.Op {
	case OpHello:
		b = binary.BigEndian.AppendUint16(b, req.Version)
		b = appendBytes16(b, []byte(req.Token))
	case OpPing:
	case OpStatus:
		if req.StatusFormat != 0 {
			b = append(b, req.StatusFormat)
		}
	case OpGet:
		b = appendBytes16(b, req.Key)
	case OpMemberList, OpMemberAdd, OpMemberRemove, OpMemberPromote, OpTransferLeader:
		b = appendMemberRequest(b, req)
	case OpPut, OpDelete, OpCAS:
		b = appendWriteID(b, req)
		b = appendKeyOp(b, req.Op, keyOp{req.Key, req.Value, req.ExpectPresent, req.ExpectDigest, req.Expect})
	case OpScan:
		b = appendBytes16(b, req.Start)
		b = appendBytes16(b, req.End)
		b = binary.BigEndian.AppendUint32(b, req.Limit)
	case OpBatch:
		b = appendWriteID(b, req)
		b = binary.BigEndian.AppendUint16(b, uint16(len(req.Ops)))
		for i := range req.Ops {
			op := &req.Ops[i]
			b = append(b, byte(op.Op))
			b = appendKeyOp(b, op.Op, keyOp{op.Key, op.Value, op.ExpectPresent, op.ExpectDigest, op.Expect})
		}
	}
	return b
}

func appendWriteID(b []byte, req *Request) []byte {
	b = binary.BigEndian.AppendUint64(b, req.ClientID)
	b = binary.BigEndian.AppendUint64(b, req.Seq)
	return binary.BigEndian.AppendUint64(b, req.FirstUnacked)
}

// appendKeyOp appends the key-level part of PUT, DELETE and CAS, shared by
// the single-key opcodes and the operations inside a BATCH.
func appendKeyOp(b []byte, op Opcode, k keyOp) []byte {
	b = appendBytes16(b, k.key)
	switch op {
	case OpPut:
		b = appendBytes32(b, k.value)
	case OpCAS:
		expect := byte(expectAbsent)
		switch {
		case k.expectPresent && k.expectDigest:
			expect = expectDigest
		case k.expectPresent:
			expect = expectValue
		}
		b = append(b, expect)
		b = appendBytes32(b, k.expect)
		b = appendBytes32(b, k.value)
	}
	return b
}

// DecodeRequest decodes a request body for header h and validates it:
// field limits, write identity (client id non-zero, 1 <= FirstUnacked <=
// Seq), scan limit, batch size and operation kinds. Errors wrap ErrTooLarge
// for size limits and ErrMalformed otherwise.
func DecodeRequest(h Header, body []byte) (*Request, error) {
	if h.Flags&FlagResponse != 0 {
		return nil, fmt.Errorf("%w: response flag on a request", ErrMalformed)
	}
	if h.Status != StatusOK {
		return nil, fmt.Errorf("%w: status %d on a request", ErrMalformed, h.Status)
	}
	if h.Flags&FlagStaleOK != 0 && h.Op != OpGet && h.Op != OpScan {
		return nil, fmt.Errorf("%w: stale-ok flag on %v", ErrMalformed, h.Op)
	}
	if len(body) > RequestBodyBytesMax {
		return nil, fmt.Errorf("%w: request body of %d bytes exceeds %d (RequestBodyBytesMax)", ErrTooLarge, len(body), RequestBodyBytesMax)
	}
	req := &Request{Op: h.Op, Flags: h.Flags, Tenant: h.Tenant, ID: h.ID}
	r := &reader{b: body}
	switch h.Op {
	case OpHello:
		req.Version = r.u16("version")
		req.Token = string(r.bytes16("token", TokenBytesMax))
	case OpPing:
	case OpStatus:
		if len(body) > 0 {
			req.StatusFormat = r.u8("status format")
			if r.err == nil && req.StatusFormat != StatusFormatBasic && req.StatusFormat != StatusFormatProgress {
				r.fail("unknown status format %d", req.StatusFormat)
			}
		}
	case OpGet:
		req.Key = r.bytes16("key", KeyBytesMax)
		if r.err == nil && len(req.Key) == 0 {
			r.fail("empty key")
		}
	case OpPut, OpDelete, OpCAS:
		readWriteID(r, req)
		k := readKeyOp(r, h.Op)
		req.Key, req.Value, req.ExpectPresent, req.ExpectDigest, req.Expect = k.key, k.value, k.expectPresent, k.expectDigest, k.expect
	case OpMemberList, OpMemberAdd, OpMemberRemove, OpMemberPromote, OpTransferLeader:
		readMemberRequest(r, req)
	case OpScan:
		req.Start = r.bytes16("start", ScanStartBytesMax)
		req.End = r.bytes16("end", KeyBytesMax)
		req.Limit = r.u32("limit")
		if r.err == nil && (req.Limit == 0 || req.Limit > ScanLimitMax) {
			r.fail("scan limit %d outside 1..%d", req.Limit, ScanLimitMax)
		}
	case OpBatch:
		readWriteID(r, req)
		n := int(r.u16("op count"))
		if r.err == nil && (n == 0 || n > BatchOpsMax) {
			r.fail("batch of %d operations outside 1..%d", n, BatchOpsMax)
		}
		if r.err == nil {
			req.Ops = make([]BatchOp, 0, n)
		}
		for i := 0; i < n && r.err == nil; i++ {
			var op BatchOp
			op.Op = Opcode(r.u8("batch op"))
			if r.err == nil && op.Op != OpPut && op.Op != OpDelete && op.Op != OpCAS {
				r.fail("batch op %d: %v not allowed in a batch", i, op.Op)
			}
			k := readKeyOp(r, op.Op)
			op.Key, op.Value, op.ExpectPresent, op.ExpectDigest, op.Expect = k.key, k.value, k.expectPresent, k.expectDigest, k.expect
			req.Ops = append(req.Ops, op)
		}
	}
	if err := r.done(); err != nil {
		return nil, fmt.Errorf("%v body: %w", h.Op, err)
	}
	return req, nil
}

func readWriteID(r *reader, req *Request) {
	req.ClientID = r.u64("client id")
	req.Seq = r.u64("seq")
	req.FirstUnacked = r.u64("first unacked")
	if r.err != nil {
		return
	}
	switch {
	case req.ClientID == 0:
		r.fail("client id 0 is reserved")
	case req.Seq == 0:
		r.fail("seq 0 is reserved")
	case req.Seq > SeqMax:
		r.fail("seq %d is reserved (at most %d: the tombstone one above it must fit in 64 bits)", req.Seq, uint64(SeqMax))
	case req.FirstUnacked == 0 || req.FirstUnacked > req.Seq:
		r.fail("first unacked %d outside 1..seq=%d", req.FirstUnacked, req.Seq)
	}
}

func readKeyOp(r *reader, op Opcode) (k keyOp) {
	k.key = r.bytes16("key", KeyBytesMax)
	if r.err == nil && len(k.key) == 0 {
		r.fail("empty key")
	}
	switch op {
	case OpPut:
		k.value = r.bytes32("value", ValueBytesMax)
	case OpCAS:
		expect := r.u8("expect")
		if r.err == nil && expect > expectDigest {
			r.fail("expect byte is %d (0 absent, 1 value, 2 digest)", expect)
		}
		k.expectPresent, k.expectDigest = expect != expectAbsent, expect == expectDigest
		k.expect = r.bytes32("expect", ValueBytesMax)
		k.value = r.bytes32("value", ValueBytesMax)
		switch {
		case r.err != nil:
		case expect == expectAbsent && len(k.expect) != 0:
			r.fail("expect value given with expect-absent")
		case expect == expectDigest && len(k.expect) != ExpectDigestBytes:
			r.fail("expect digest of %d bytes, want %d", len(k.expect), ExpectDigestBytes)
		}
	}
	return k
}

// DecodeFrame decodes one complete request frame from the start of b and
// returns it with the number of bytes it used. It is what a server does
// with a byte stream, in one call; the server itself reads the header first
// so that admission can run before the body is decoded.
func DecodeFrame(b []byte) (*Request, int, error) {
	h, err := DecodeHeader(b)
	if err != nil {
		return nil, 0, err
	}
	n := HeaderBytes + int(h.Length)
	if len(b) < n {
		return nil, 0, fmt.Errorf("%w: frame needs %d bytes, have %d", ErrMalformed, n, len(b))
	}
	req, err := DecodeRequest(h, b[HeaderBytes:n])
	if err != nil {
		return nil, 0, err
	}
	return req, n, nil
}
