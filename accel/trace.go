package accel

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"synod/paxos"
)

// Trace format, version 1 (all integers little-endian; the constants below
// are part of the format). Documented with a worked example in README.md.
//
//	header, 64 bytes:
//	  0  [8]byte  magic "SYNACCEL"
//	  8  u32      version (1)
//	 12  u32      record bytes (64)
//	 16  u32      Spec.WindowSlots
//	 20  u32      Spec.Replicas
//	 24  u32      Spec.Quorum
//	 28  u32      Spec.HeartbeatPeriodTicks
//	 32  u32      Spec.LeaseTicks
//	 36  u32      Spec.LeaseDriftTicks
//	 40  u32      Spec.ElectionTicks
//	 44  u32      Spec.ElectionJitterTicks
//	 48  u32      Spec.TenantsMax
//	 52  u32      Spec.Seed
//	 56  u64      reserved, zero
//
//	record, 64 bytes, repeated to the end of the file:
//	  0  u64  Seq     input sequence number (outputs carry their input's)
//	  8  u8   Kind
//	  9  u8   Flags
//	 10  u16  Index
//	 12  u32  Len
//	 16  u64  Now
//	 24  u64  Slot
//	 32  u64  Ballot.Round
//	 40  u64  Ballot.Node
//	 48  u64  Node
//	 56  u64  Value
//
// Value2 (only InSetTenantOps/InSetTenantBytes use it) does not fit the
// record: those inputs carry the burst in Slot instead (see encode).
//
// Ordering rules a reader checks: the first input has Seq 1 and each next
// input Seq+1; every output follows its input and carries the same Seq.
const (
	traceMagic        = "SYNACCEL"
	traceVersion      = 1
	TraceHeaderBytes  = 64
	TraceRecordBytes  = 64
	traceRecordsMaxRd = 1 << 28 // ReadTrace refuses longer traces (16 GiB)
)

// ErrBadTrace wraps every trace parsing failure.
var ErrBadTrace = errors.New("accel: bad trace")

// TraceWriter writes a trace. Errors are sticky.
type TraceWriter struct {
	w   *bufio.Writer
	err error
	buf [TraceRecordBytes]byte
}

// NewTraceWriter buffers w. Call WriteHeader first, Flush at the end.
func NewTraceWriter(w io.Writer) *TraceWriter {
	return &TraceWriter{w: bufio.NewWriterSize(w, 1<<16)}
}

// WriteHeader writes the header for spec.
func (t *TraceWriter) WriteHeader(spec Spec) {
	t.write(encodeHeader(spec))
}

// Write appends one record.
func (t *TraceWriter) Write(e Event) {
	encodeRecord(t.buf[:], e)
	t.write(t.buf[:])
}

func (t *TraceWriter) write(b []byte) {
	if t.err != nil {
		return
	}
	_, t.err = t.w.Write(b)
}

// Flush writes what is buffered and returns the first error.
func (t *TraceWriter) Flush() error {
	if t.err == nil {
		t.err = t.w.Flush()
	}
	return t.err
}

// Err returns the first error.
func (t *TraceWriter) Err() error { return t.err }

func encodeHeader(s Spec) []byte {
	b := make([]byte, TraceHeaderBytes)
	copy(b, traceMagic)
	le := binary.LittleEndian
	le.PutUint32(b[8:], traceVersion)
	le.PutUint32(b[12:], TraceRecordBytes)
	le.PutUint32(b[16:], uint32(s.WindowSlots))
	le.PutUint32(b[20:], uint32(s.Replicas))
	le.PutUint32(b[24:], uint32(s.Quorum))
	le.PutUint32(b[28:], s.HeartbeatPeriodTicks)
	le.PutUint32(b[32:], s.LeaseTicks)
	le.PutUint32(b[36:], s.LeaseDriftTicks)
	le.PutUint32(b[40:], s.ElectionTicks)
	le.PutUint32(b[44:], s.ElectionJitterTicks)
	le.PutUint32(b[48:], uint32(s.TenantsMax))
	le.PutUint32(b[52:], s.Seed)
	return b
}

func decodeHeader(b []byte) (Spec, error) {
	le := binary.LittleEndian
	if string(b[:8]) != traceMagic {
		return Spec{}, fmt.Errorf("%w: magic %q", ErrBadTrace, b[:8])
	}
	if v := le.Uint32(b[8:]); v != traceVersion {
		return Spec{}, fmt.Errorf("%w: version %d, want %d", ErrBadTrace, v, traceVersion)
	}
	if n := le.Uint32(b[12:]); n != TraceRecordBytes {
		return Spec{}, fmt.Errorf("%w: record bytes %d, want %d", ErrBadTrace, n, TraceRecordBytes)
	}
	if le.Uint64(b[56:]) != 0 {
		return Spec{}, fmt.Errorf("%w: reserved header bytes not zero", ErrBadTrace)
	}
	s := Spec{
		WindowSlots:          int(le.Uint32(b[16:])),
		Replicas:             int(le.Uint32(b[20:])),
		Quorum:               int(le.Uint32(b[24:])),
		HeartbeatPeriodTicks: le.Uint32(b[28:]),
		LeaseTicks:           le.Uint32(b[32:]),
		LeaseDriftTicks:      le.Uint32(b[36:]),
		ElectionTicks:        le.Uint32(b[40:]),
		ElectionJitterTicks:  le.Uint32(b[44:]),
		TenantsMax:           int(le.Uint32(b[48:])),
		Seed:                 le.Uint32(b[52:]),
	}
	if err := s.Validate(); err != nil {
		return Spec{}, fmt.Errorf("%w: header spec: %v", ErrBadTrace, err)
	}
	return s, nil
}

// usesValue2 reports the kinds whose Value2 travels in the Slot field.
func usesValue2(k Kind) bool { return k == InSetTenantOps || k == InSetTenantBytes }

func encodeRecord(b []byte, e Event) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], e.Seq)
	b[8] = byte(e.Kind)
	b[9] = e.Flags
	le.PutUint16(b[10:], e.Index)
	le.PutUint32(b[12:], e.Len)
	le.PutUint64(b[16:], e.Now)
	slot := uint64(e.Slot)
	if usesValue2(e.Kind) {
		slot = e.Value2
	}
	le.PutUint64(b[24:], slot)
	le.PutUint64(b[32:], e.Ballot.Round)
	le.PutUint64(b[40:], uint64(e.Ballot.Node))
	le.PutUint64(b[48:], uint64(e.Node))
	le.PutUint64(b[56:], e.Value)
}

func decodeRecord(b []byte) Event {
	le := binary.LittleEndian
	e := Event{
		Seq:    le.Uint64(b[0:]),
		Kind:   Kind(b[8]),
		Flags:  b[9],
		Index:  le.Uint16(b[10:]),
		Len:    le.Uint32(b[12:]),
		Now:    le.Uint64(b[16:]),
		Ballot: paxos.Ballot{Round: le.Uint64(b[32:]), Node: paxos.NodeID(le.Uint64(b[40:]))},
		Node:   paxos.NodeID(le.Uint64(b[48:])),
		Value:  le.Uint64(b[56:]),
	}
	if usesValue2(e.Kind) {
		e.Value2 = le.Uint64(b[24:])
	} else {
		e.Slot = paxos.Slot(le.Uint64(b[24:]))
	}
	return e
}

// TraceReader reads a trace one record at a time, checking the ordering
// rules as it goes.
type TraceReader struct {
	r       *bufio.Reader
	spec    Spec
	lastSeq uint64
	n       uint64
	buf     [TraceRecordBytes]byte
}

// NewTraceReader reads and checks the header.
func NewTraceReader(r io.Reader) (*TraceReader, error) {
	tr := &TraceReader{r: bufio.NewReaderSize(r, 1<<16)}
	var h [TraceHeaderBytes]byte
	if _, err := io.ReadFull(tr.r, h[:]); err != nil {
		return nil, fmt.Errorf("%w: reading header: %v", ErrBadTrace, err)
	}
	s, err := decodeHeader(h[:])
	if err != nil {
		return nil, err
	}
	tr.spec = s
	return tr, nil
}

// Spec returns the spec from the header.
func (tr *TraceReader) Spec() Spec { return tr.spec }

// Next returns the next record, io.EOF at a clean end, or an error wrapping
// ErrBadTrace (a truncated record, an unknown kind, a broken order).
func (tr *TraceReader) Next() (Event, error) {
	n, err := io.ReadFull(tr.r, tr.buf[:])
	if err == io.EOF {
		return Event{}, io.EOF
	}
	if err != nil {
		return Event{}, fmt.Errorf("%w: record %d truncated after %d bytes", ErrBadTrace, tr.n, n)
	}
	e := decodeRecord(tr.buf[:])
	if !e.Kind.Known() {
		return Event{}, fmt.Errorf("%w: record %d: unknown kind %d", ErrBadTrace, tr.n, e.Kind)
	}
	if e.Kind.IsInput() {
		if e.Seq != tr.lastSeq+1 {
			return Event{}, fmt.Errorf("%w: record %d: input seq %d after %d", ErrBadTrace, tr.n, e.Seq, tr.lastSeq)
		}
		tr.lastSeq = e.Seq
	} else if e.Seq != tr.lastSeq || e.Seq == 0 {
		return Event{}, fmt.Errorf("%w: record %d: output seq %d does not follow input %d", ErrBadTrace, tr.n, e.Seq, tr.lastSeq)
	}
	tr.n++
	if tr.n > traceRecordsMaxRd {
		return Event{}, fmt.Errorf("%w: more than %d records", ErrBadTrace, traceRecordsMaxRd)
	}
	return e, nil
}

// ReadTrace parses a whole trace: its spec and every record in order.
// Malformed input is an error wrapping ErrBadTrace, never a panic.
func ReadTrace(r io.Reader) (Spec, []Event, error) {
	tr, err := NewTraceReader(r)
	if err != nil {
		return Spec{}, nil, err
	}
	var evs []Event
	for {
		e, err := tr.Next()
		if err == io.EOF {
			return tr.spec, evs, nil
		}
		if err != nil {
			return Spec{}, nil, err
		}
		evs = append(evs, e)
	}
}

// WriteTrace writes spec and events as a trace (the inverse of ReadTrace).
func WriteTrace(w io.Writer, spec Spec, evs []Event) error {
	tw := NewTraceWriter(w)
	tw.WriteHeader(spec)
	for _, e := range evs {
		tw.Write(e)
	}
	return tw.Flush()
}

// ReplayResult is what Replay found.
type ReplayResult struct {
	Inputs, Outputs, Mismatches uint64
	First                       string // the first mismatch, described
}

// Replay rebuilds a plane from the trace's spec, feeds it every recorded
// input and compares its outputs with the recorded ones, exactly. This is
// the Go side of what the RTL co-simulation does.
func Replay(r io.Reader) (ReplayResult, error) {
	tr, err := NewTraceReader(r)
	if err != nil {
		return ReplayResult{}, err
	}
	st := newState(tr.spec)
	var res ReplayResult
	var want, got []Event
	check := func() {
		if len(got) != len(want) {
			res.Mismatches++
			if res.First == "" {
				res.First = fmt.Sprintf("seq %d: %d outputs recorded, %d replayed", seqOf(want, got), len(want), len(got))
			}
			return
		}
		for i := range got {
			if got[i] != want[i] {
				res.Mismatches++
				if res.First == "" {
					res.First = fmt.Sprintf("recorded %v, replayed %v", want[i], got[i])
				}
				return
			}
		}
	}
	started := false
	for {
		e, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return res, err
		}
		if !e.Kind.IsInput() {
			want = append(want, e)
			res.Outputs++
			continue
		}
		if started {
			check()
		}
		started = true
		want = want[:0]
		res.Inputs++
		got = st.apply(e, got[:0])
	}
	if started {
		check()
	}
	return res, nil
}

func seqOf(a, b []Event) uint64 {
	if len(a) > 0 {
		return a[0].Seq
	}
	if len(b) > 0 {
		return b[0].Seq
	}
	return 0
}
