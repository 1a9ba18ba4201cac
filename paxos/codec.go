package paxos

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire format (little-endian), version codecVersion. The constants below are
// part of the format.
//
//	message := version:u8 type:u8 flags:u8 cluster:u64 from:u64 to:u64
//	           ballot.round:u64 ballot.node:u64 slot:u64 commit:u64
//	           index:u64 last:u64 context:u64
//	           nentries:u32 entry*  [snapshot if flags&flagSnapshot]
//	entry   := slot:u64 ballot.round:u64 ballot.node:u64 type:u8
//	           ncmds:u32 (len:u32 bytes)*
//	snapshot:= slot:u64 nmembers:u32 member:u64* nlearners:u32 learner:u64*
//
// Every count and length is checked against the limits before anything is
// allocated, so a hostile length cannot make the decoder allocate much.
//
// Versions: 1 carried the snapshot's data in MsgSnapshot (len:u32 bytes
// after the members); 2 carries only its metadata (the state is streamed
// by the runtime outside consensus messages); 3 adds the learners to the
// snapshot metadata, flagJoining and MsgTransfer (membership.go, join.go,
// transfer.go); 4 changes no message but fences nodes older than the
// digest CAS condition (kv/proto, CAS expect byte 2) out of a cluster
// whose commands may carry it: such a node would decode those commands as
// malformed and apply nothing where the others write. A node decodes only its own
// version, so a cluster crosses a version change by stopping every node,
// upgrading, and starting them again. The ConfChange encoding inside
// EntryConfChange entries is durable in acceptor logs and keeps its own
// versions (membership.go), independent of this one.
const (
	codecVersion = 4

	// EntriesPerMessageMax bounds the entries one message carries.
	EntriesPerMessageMax = 4096
	// CmdsPerEntryMax bounds the commands batched into one slot on the wire.
	CmdsPerEntryMax = 4096
	// CmdBytesMax bounds one command.
	CmdBytesMax = 1 << 20
	// MessageBytesMax bounds one encoded message.
	MessageBytesMax = 64 << 20
	// messageEntryBytesMax bounds the encoded entries the protocol puts in
	// one message, leaving room for the header under MessageBytesMax.
	messageEntryBytesMax = MessageBytesMax / 2
	// MembersMax bounds the membership of a group.
	MembersMax = 64

	flagReject   = 1 << 0
	flagSnapshot = 1 << 1
	// flagJoining: Message.Joining (a heartbeat answer of a joining node).
	flagJoining = 1 << 2
	flagsKnown  = flagReject | flagSnapshot | flagJoining

	messageHeaderBytes = 3 + 8*10 + 4
	entryHeaderBytes   = 8*3 + 1 + 4
)

// Encoded sizes a caller needs to bound what one entry takes in its own
// storage (kv/replica derives its command limit from them): an entry
// encodes to EntryHeaderBytes plus, per command, CmdLenBytes and the
// command's bytes (AppendEntry).
const (
	EntryHeaderBytes = entryHeaderBytes
	CmdLenBytes      = 4
)

// entryBytes is the encoded size of e.
func entryBytes(e *Entry) int {
	n := entryHeaderBytes
	for _, c := range e.Cmds {
		n += 4 + len(c)
	}
	return n
}

// EntrySize is the exact length of AppendEntry's encoding of e, so a
// caller can size its buffer once instead of growing it while encoding.
func EntrySize(e *Entry) int { return entryBytes(e) }

// MessageSize is the exact length of AppendMessage's encoding of m
// (TestMessageRoundTrip and FuzzUnmarshalMessage hold it to that). The runtime encodes every
// outgoing message into a buffer of this size: one allocation a message,
// where appending to nil grew the buffer by doubling, several copies and
// allocations for each Accept that carries a batch of commands.
func MessageSize(m *Message) int {
	n := messageHeaderBytes + EntriesSize(m.Entries)
	if s := m.Snapshot; s != nil {
		n += snapshotMetaBytes(s)
	}
	return n
}

// snapshotMetaBytes is the encoded size of s (AppendSnapshotMeta).
func snapshotMetaBytes(s *SnapshotMeta) int {
	return 8 + 4 + 8*len(s.Members) + 4 + 8*len(s.Learners)
}

// errDecode is wrapped by every decoding error.
var errDecode = errors.New("paxos: malformed encoding")

// AppendMessage appends the wire encoding of m to buf.
func AppendMessage(buf []byte, m *Message) []byte {
	buf = AppendMessageHead(buf, m)
	buf = AppendEntries(buf, m.Entries)
	if s := m.Snapshot; s != nil {
		buf = AppendSnapshotMeta(buf, s)
	}
	return buf
}

// MessageHeadBytes is the size of a message's head (AppendMessageHead).
const MessageHeadBytes = messageHeaderBytes

// AppendMessageHead appends the head of m's wire encoding to buf: every
// field and the number of entries, MessageHeadBytes in all. For a message
// without a snapshot, the head then AppendEntries of its entries is
// AppendMessage byte for byte: a leader sending the same entries to every
// follower encodes them once and each follower's head alone.
func AppendMessageHead(buf []byte, m *Message) []byte {
	var flags uint8
	if m.Reject {
		flags |= flagReject
	}
	if m.Snapshot != nil {
		flags |= flagSnapshot
	}
	if m.Joining {
		flags |= flagJoining
	}
	buf = append(buf, codecVersion, byte(m.Type), flags)
	buf = binary.LittleEndian.AppendUint64(buf, m.Cluster)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(m.From))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(m.To))
	buf = appendBallot(buf, m.Ballot)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(m.Slot))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(m.Commit))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(m.Index))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(m.Last))
	buf = binary.LittleEndian.AppendUint64(buf, m.Context)
	return binary.LittleEndian.AppendUint32(buf, uint32(len(m.Entries)))
}

// EntriesSize is the encoded size of ents (AppendEntries).
func EntriesSize(ents []Entry) int {
	n := 0
	for i := range ents {
		n += entryBytes(&ents[i])
	}
	return n
}

// AppendEntries appends the encoding of ents, the part of a message's
// encoding after its head (AppendMessageHead).
func AppendEntries(buf []byte, ents []Entry) []byte {
	for i := range ents {
		buf = AppendEntry(buf, &ents[i])
	}
	return buf
}

// AppendSnapshotMeta appends the encoding of a snapshot's metadata (the
// snapshot part of a message; the runtime stamps snapshot streams with it
// too).
func AppendSnapshotMeta(buf []byte, s *SnapshotMeta) []byte {
	buf = binary.LittleEndian.AppendUint64(buf, uint64(s.Slot))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(s.Members)))
	for _, id := range s.Members {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(id))
	}
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(s.Learners)))
	for _, id := range s.Learners {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(id))
	}
	return buf
}

// UnmarshalSnapshotMeta decodes exactly one AppendSnapshotMeta encoding.
// Malformed input (a member count above MembersMax included) is an error,
// never a panic; the result does not alias b. It checks the encoding, not
// the values (InstallSnapshot checks those).
func UnmarshalSnapshotMeta(b []byte) (SnapshotMeta, error) {
	d := decoder{b: b}
	s := d.snapshotMeta()
	if d.err != nil {
		return SnapshotMeta{}, d.err
	}
	if len(d.b) != 0 {
		return SnapshotMeta{}, fmt.Errorf("%w: %d trailing bytes after snapshot metadata", errDecode, len(d.b))
	}
	return s, nil
}

func appendBallot(buf []byte, b Ballot) []byte {
	buf = binary.LittleEndian.AppendUint64(buf, b.Round)
	return binary.LittleEndian.AppendUint64(buf, uint64(b.Node))
}

// UnmarshalMessage decodes one message. Malformed input is an error, never a
// panic. The result does not alias b.
func UnmarshalMessage(b []byte) (Message, error) {
	var m Message
	if len(b) > MessageBytesMax {
		return m, fmt.Errorf("%w: message of %d bytes exceeds %d", errDecode, len(b), MessageBytesMax)
	}
	d := decoder{b: b}
	if v := d.u8(); v != codecVersion {
		if d.err != nil {
			return m, d.err
		}
		return m, fmt.Errorf("%w: version %d, want %d", errDecode, v, codecVersion)
	}
	m.Type = MsgType(d.u8())
	flags := d.u8()
	if d.err == nil && (m.Type == 0 || m.Type > msgTypeMax) {
		return m, fmt.Errorf("%w: unknown message type %d", errDecode, m.Type)
	}
	if d.err == nil && flags&^flagsKnown != 0 {
		return m, fmt.Errorf("%w: unknown flags %#x", errDecode, flags)
	}
	m.Reject = flags&flagReject != 0
	m.Joining = flags&flagJoining != 0
	m.Cluster = d.u64()
	m.From = NodeID(d.u64())
	m.To = NodeID(d.u64())
	m.Ballot = d.ballot()
	m.Slot = Slot(d.u64())
	m.Commit = Slot(d.u64())
	m.Index = Slot(d.u64())
	m.Last = Slot(d.u64())
	m.Context = d.u64()
	n := d.u32()
	if d.err != nil {
		return Message{}, d.err
	}
	if n > EntriesPerMessageMax {
		return Message{}, fmt.Errorf("%w: %d entries exceed %d", errDecode, n, EntriesPerMessageMax)
	}
	if n > 0 {
		if uint64(n)*entryHeaderBytes > uint64(len(d.b)) {
			return Message{}, fmt.Errorf("%w: %d entries in %d bytes", errDecode, n, len(d.b))
		}
		m.Entries = make([]Entry, n)
		for i := range m.Entries {
			m.Entries[i] = d.entry()
			if d.err != nil {
				return Message{}, d.err
			}
		}
	}
	if flags&flagSnapshot != 0 {
		s := d.snapshotMeta()
		m.Snapshot = &s
	}
	if d.err != nil {
		return Message{}, d.err
	}
	if len(d.b) != 0 {
		return Message{}, fmt.Errorf("%w: %d trailing bytes", errDecode, len(d.b))
	}
	return m, nil
}

// AppendEntry appends the encoding of one entry (for the acceptor log).
func AppendEntry(buf []byte, e *Entry) []byte {
	buf = binary.LittleEndian.AppendUint64(buf, uint64(e.Slot))
	buf = appendBallot(buf, e.Ballot)
	buf = append(buf, byte(e.Type))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(e.Cmds)))
	for _, c := range e.Cmds {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(c)))
		buf = append(buf, c...)
	}
	return buf
}

// UnmarshalEntry decodes one entry encoded by AppendEntry. The result does
// not alias b.
func UnmarshalEntry(b []byte) (Entry, error) {
	d := decoder{b: b}
	e := d.entry()
	if d.err != nil {
		return Entry{}, d.err
	}
	if len(d.b) != 0 {
		return Entry{}, fmt.Errorf("%w: %d trailing bytes after entry", errDecode, len(d.b))
	}
	return e, nil
}

// decoder reads fixed-width fields; the first error sticks and every later
// read returns zero, so callers check d.err once per step.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) need(n int) bool {
	if d.err != nil {
		return false
	}
	if len(d.b) < n {
		d.err = fmt.Errorf("%w: truncated (need %d bytes, have %d)", errDecode, n, len(d.b))
		return false
	}
	return true
}

func (d *decoder) u8() uint8 {
	if !d.need(1) {
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) u32() uint32 {
	if !d.need(4) {
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) u64() uint64 {
	if !d.need(8) {
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) ballot() Ballot {
	r := d.u64()
	return Ballot{Round: r, Node: NodeID(d.u64())}
}

// bytes reads a u32 length and that many bytes, copied.
func (d *decoder) bytes(limit int) []byte {
	v := d.view(limit)
	if d.err != nil {
		return nil
	}
	return append(make([]byte, 0, len(v)), v...)
}

// view reads a u32 length and that many bytes, aliasing the input.
func (d *decoder) view(limit int) []byte {
	n := d.u32()
	if d.err != nil {
		return nil
	}
	if uint64(n) > uint64(limit) {
		d.err = fmt.Errorf("%w: %d bytes exceed %d", errDecode, n, limit)
		return nil
	}
	if !d.need(int(n)) {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) snapshotMeta() SnapshotMeta {
	var s SnapshotMeta
	s.Slot = Slot(d.u64())
	s.Members = d.nodeIDs("members", MembersMax)
	s.Learners = d.nodeIDs("learners", MembersMax-len(s.Members))
	if d.err != nil {
		return SnapshotMeta{}
	}
	return s
}

// nodeIDs reads a u32 count (at most limit) and that many node ids.
func (d *decoder) nodeIDs(what string, limit int) []NodeID {
	n := d.u32()
	if d.err != nil || n == 0 {
		return nil
	}
	if uint64(n) > uint64(limit) {
		d.err = fmt.Errorf("%w: %d %s exceed %d", errDecode, n, what, limit)
		return nil
	}
	if uint64(n)*8 > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: %d %s in %d bytes", errDecode, n, what, len(d.b))
		return nil
	}
	ids := make([]NodeID, 0, n)
	for i := uint32(0); i < n && d.err == nil; i++ {
		ids = append(ids, NodeID(d.u64()))
	}
	return ids
}

func (d *decoder) entry() Entry {
	var e Entry
	e.Slot = Slot(d.u64())
	e.Ballot = d.ballot()
	e.Type = EntryType(d.u8())
	n := d.u32()
	if d.err != nil {
		return Entry{}
	}
	if e.Type < EntryNormal || e.Type > EntryConfChange {
		d.err = fmt.Errorf("%w: unknown entry type %d", errDecode, e.Type)
		return Entry{}
	}
	if n > CmdsPerEntryMax {
		d.err = fmt.Errorf("%w: %d commands exceed %d", errDecode, n, CmdsPerEntryMax)
		return Entry{}
	}
	if uint64(n)*4 > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: %d commands in %d bytes", errDecode, n, len(d.b))
		return Entry{}
	}
	if n > 0 {
		e.Cmds = make([][]byte, n)
		// One copy for all the entry's commands, each its own capped
		// slice of it: they are applied or dropped together, and one
		// allocation a command cost a restart's recovery of a 40 MiB log
		// tail tens of thousands of them (BenchmarkRecoverAcceptorLog).
		// cmdsBytes sizes buf exactly; were it short, append would move
		// buf and the earlier slices would keep the old copy: still no
		// alias of the input.
		buf := make([]byte, 0, cmdsBytes(d.b, int(n)))
		for i := range e.Cmds {
			c := d.view(CmdBytesMax)
			if d.err != nil {
				return Entry{}
			}
			buf = append(buf, c...)
			e.Cmds[i] = buf[len(buf)-len(c) : len(buf) : len(buf)]
		}
	}
	return e
}

// cmdsBytes is the total length of the n length-prefixed commands at the
// start of b, counting only those that are whole and within CmdBytesMax
// (the decoder reports the first that is not).
func cmdsBytes(b []byte, n int) int {
	total := 0
	for range n {
		if len(b) < 4 {
			break
		}
		l := binary.LittleEndian.Uint32(b)
		if uint64(l) > CmdBytesMax || uint64(l) > uint64(len(b)-4) {
			break
		}
		total += int(l)
		b = b[4+l:]
	}
	return total
}
