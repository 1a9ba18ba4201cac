package proto

import (
	"encoding/binary"
	"fmt"
)

// appendBytes16 appends a u16 length and the bytes; callers keep len(p)
// within the field's limit, which is always below 1<<16.
func appendBytes16(b, p []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(p)))
	return append(b, p...)
}

func appendBytes32(b, p []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
	return append(b, p...)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// reader decodes a body; the first failure sticks in err and later reads
// return zero values, so decoders check err once at the end.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
	}
}

func (r *reader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b)-r.off < n {
		r.fail("%s: need %d bytes at offset %d, have %d", what, n, r.off, len(r.b)-r.off)
		return nil
	}
	p := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return p
}

func (r *reader) u8(what string) uint8 {
	p := r.take(1, what)
	if p == nil {
		return 0
	}
	return p[0]
}

func (r *reader) u16(what string) uint16 {
	p := r.take(2, what)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint16(p)
}

func (r *reader) u32(what string) uint32 {
	p := r.take(4, what)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint32(p)
}

func (r *reader) u64(what string) uint64 {
	p := r.take(8, what)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint64(p)
}

func (r *reader) boolean(what string) bool {
	v := r.u8(what)
	if v > 1 {
		r.fail("%s: boolean byte is %d", what, v)
	}
	return v == 1
}

// bytes16 reads a u16-length-prefixed field of at most max bytes. The
// result aliases the input buffer.
func (r *reader) bytes16(what string, max int) []byte {
	n := int(r.u16(what))
	if r.err == nil && n > max {
		r.err = fmt.Errorf("%w: %s: %d bytes exceeds %d", ErrTooLarge, what, n, max)
		return nil
	}
	return r.take(n, what)
}

func (r *reader) bytes32(what string, max int) []byte {
	n := r.u32(what)
	if r.err == nil && uint64(n) > uint64(max) {
		r.err = fmt.Errorf("%w: %s: %d bytes exceeds %d", ErrTooLarge, what, n, max)
		return nil
	}
	return r.take(int(n), what)
}

func (r *reader) done() error {
	if r.err == nil && r.off != len(r.b) {
		r.fail("%d trailing bytes", len(r.b)-r.off)
	}
	return r.err
}
