package sm

import (
	"encoding/binary"
	"fmt"

	"synod/kv/proto"
	"synod/tenants"
)

// commandVersion is the first byte of every encoded command.
const commandVersion = 1

// commandHeaderBytes: version u8, tenant u32, opcode u8.
const commandHeaderBytes = 6

// The protocol's size chain counts on this header size (kv/proto); this
// line stops compiling if the two differ.
var _ = [1]struct{}{}[commandHeaderBytes-proto.CommandHeaderBytes]

// EncodeCommand encodes a write request of tenant as a command for the
// consensus log:
//
//	version u8 (=1) | tenant u32 BE | opcode u8 | request body (proto wire form)
//
// The request id and flags are not part of the command: replicas answer
// nothing, and the result a leader returns is matched to its connection by
// the runtime. req.Op must be a write (PUT, DELETE, CAS, BATCH).
func EncodeCommand(tenant tenants.ID, req *proto.Request) []byte {
	return AppendCommand(make([]byte, 0, CommandBytes(req)), tenant, req)
}

// AppendCommand appends EncodeCommand(tenant, req) to b.
func AppendCommand(b []byte, tenant tenants.ID, req *proto.Request) []byte {
	b = append(b, commandVersion)
	b = binary.BigEndian.AppendUint32(b, uint32(tenant))
	b = append(b, byte(req.Op))
	return proto.AppendRequestBody(b, req)
}

// CommandBytes is the room EncodeCommand(_, req) is given up front: its
// header, every key, value and expected value, and 64 bytes for the body's
// fields, 16 more for each BATCH operation's. Room short of the command
// only costs a copy (append grows the buffer).
func CommandBytes(req *proto.Request) int {
	n := commandHeaderBytes + len(req.Key) + len(req.Value) + len(req.Expect) + 64
	for i := range req.Ops {
		n += len(req.Ops[i].Key) + len(req.Ops[i].Value) + len(req.Ops[i].Expect) + 16
	}
	return n
}

// DecodeCommand decodes a command made by EncodeCommand. The request's
// byte slices alias b.
func DecodeCommand(b []byte) (tenants.ID, *proto.Request, error) {
	if len(b) < commandHeaderBytes {
		return 0, nil, fmt.Errorf("sm: command of %d bytes is shorter than its header", len(b))
	}
	if b[0] != commandVersion {
		return 0, nil, fmt.Errorf("sm: command version %d, want %d", b[0], commandVersion)
	}
	tenant := tenants.ID(binary.BigEndian.Uint32(b[1:5]))
	op := proto.Opcode(b[5])
	if !op.IsWrite() {
		return 0, nil, fmt.Errorf("sm: command opcode %v is not a write", op)
	}
	if tenant == 0 {
		return 0, nil, ErrReservedTenant
	}
	req, err := proto.DecodeRequest(proto.Header{Op: op, Tenant: tenant}, b[commandHeaderBytes:])
	if err != nil {
		return 0, nil, fmt.Errorf("sm: decoding command: %w", err)
	}
	return tenant, req, nil
}

// Result is the outcome of one applied command.
type Result struct {
	Status proto.Status
	// Value: the current value on a single-key CAS_MISMATCH (HasValue true
	// when the key exists). A result replayed from the exactly-once table
	// carries no value.
	Value    []byte
	HasValue bool
	// FailedOp: index of the failing operation of a BATCH CAS_MISMATCH.
	FailedOp uint32
	Message  string
}

// Response converts r to the response for req.
func (r Result) Response(req *proto.Request) *proto.Response {
	return &proto.Response{Op: req.Op, Tenant: req.Tenant, ID: req.ID, Status: r.Status,
		Value: r.Value, HasValue: r.HasValue, FailedOp: r.FailedOp, Message: r.Message}
}
