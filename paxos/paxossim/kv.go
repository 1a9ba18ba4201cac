package paxossim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"synod/paxos"
)

// opKind is a client operation on the simulated KV store.
type opKind uint8

const (
	opGet    opKind = 1 // served through ReadIndex, never logged
	opPut    opKind = 2
	opAppend opKind = 3
	opCAS    opKind = 4
)

func (k opKind) String() string {
	switch k {
	case opGet:
		return "get"
	case opPut:
		return "put"
	case opAppend:
		return "append"
	case opCAS:
		return "cas"
	}
	return "op?"
}

// Limits of the command encoding.
const (
	cmdKeyBytesMax   = 255
	cmdValueBytesMax = 4096
	cmdHeaderBytes   = 1 + 4 + 8 // op, client, seq
)

// command is one logged client write. (Client, Seq) identify it: the state
// machine applies a command at most once however often a client retries it.
type command struct {
	Op     opKind
	Client uint32
	Seq    uint64
	Key    string
	Value  string
	Expect string // cas only: the value the key must hold
}

var errBadCommand = errors.New("paxossim: bad command")

// appendCommand appends the encoding of c:
//
//	op u8 | client u32 | seq u64 | keyLen u8 | key | valLen u16 | val | expLen u16 | expect
func appendCommand(buf []byte, c *command) []byte {
	buf = append(buf, byte(c.Op))
	buf = binary.BigEndian.AppendUint32(buf, c.Client)
	buf = binary.BigEndian.AppendUint64(buf, c.Seq)
	buf = append(buf, byte(len(c.Key)))
	buf = append(buf, c.Key...)
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(c.Value)))
	buf = append(buf, c.Value...)
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(c.Expect)))
	buf = append(buf, c.Expect...)
	return buf
}

func decodeCommand(b []byte) (command, error) {
	var c command
	if len(b) < cmdHeaderBytes+1 {
		return c, fmt.Errorf("%w: %d bytes", errBadCommand, len(b))
	}
	c.Op = opKind(b[0])
	if c.Op < opPut || c.Op > opCAS {
		return c, fmt.Errorf("%w: op %d", errBadCommand, c.Op)
	}
	c.Client = binary.BigEndian.Uint32(b[1:])
	c.Seq = binary.BigEndian.Uint64(b[5:])
	b = b[cmdHeaderBytes:]
	kl := int(b[0])
	b = b[1:]
	if len(b) < kl+2 {
		return c, fmt.Errorf("%w: short key", errBadCommand)
	}
	c.Key = string(b[:kl])
	b = b[kl:]
	vl := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	if vl > cmdValueBytesMax || len(b) < vl+2 {
		return c, fmt.Errorf("%w: short value", errBadCommand)
	}
	c.Value = string(b[:vl])
	b = b[vl:]
	el := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	if el > cmdValueBytesMax || len(b) != el {
		return c, fmt.Errorf("%w: bad expect length", errBadCommand)
	}
	c.Expect = string(b)
	return c, nil
}

// session is the dedup record of one client: the last sequence number
// applied for it and that operation's result. Clients have one operation
// outstanding at a time, so this is all exactly-once needs.
type session struct {
	Seq    uint64
	Result string
}

// kvApp is the replicated state machine: a few string keys, a session table
// for exactly-once, and the slot it has applied through.
type kvApp struct {
	data     map[string]string
	sessions map[uint32]session
	// Invariant: applied only moves forward, except when the app is rebuilt
	// from its durable copy on restart.
	applied paxos.Slot
	// members (the voters) and learners are the membership in force
	// after applied, tracked from EntryConfChange entries; snapshots
	// carry it in their meta.
	members  []paxos.NodeID
	learners []paxos.NodeID
}

func newKVApp() *kvApp {
	return &kvApp{data: map[string]string{}, sessions: map[uint32]session{}}
}

// results of writes as seen by clients and by the porcupine model.
const (
	resultOK    = "ok"
	resultTrue  = "true"
	resultFalse = "false"
)

// applyCommand applies c unless its (client, seq) was applied before.
func (a *kvApp) applyCommand(c *command) {
	if s, ok := a.sessions[c.Client]; ok && c.Seq <= s.Seq {
		return // a retried duplicate: applied once already
	}
	res := resultOK
	switch c.Op {
	case opPut:
		a.data[c.Key] = c.Value
	case opAppend:
		a.data[c.Key] += c.Value
	case opCAS:
		if a.data[c.Key] == c.Expect {
			a.data[c.Key] = c.Value
			res = resultTrue
		} else {
			res = resultFalse
		}
	}
	a.sessions[c.Client] = session{Seq: c.Seq, Result: res}
}

// encode returns a deterministic encoding of the whole state (sorted keys).
func (a *kvApp) encode() []byte {
	buf := binary.BigEndian.AppendUint64(nil, uint64(a.applied))
	keys := make([]string, 0, len(a.data))
	for k := range a.data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(keys)))
	for _, k := range keys {
		buf = appendString(buf, k)
		buf = appendString(buf, a.data[k])
	}
	clients := make([]uint32, 0, len(a.sessions))
	for c := range a.sessions {
		clients = append(clients, c)
	}
	slices.Sort(clients)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(a.members)))
	for _, m := range a.members {
		buf = binary.BigEndian.AppendUint64(buf, uint64(m))
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(a.learners)))
	for _, m := range a.learners {
		buf = binary.BigEndian.AppendUint64(buf, uint64(m))
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(clients)))
	for _, c := range clients {
		s := a.sessions[c]
		buf = binary.BigEndian.AppendUint32(buf, c)
		buf = binary.BigEndian.AppendUint64(buf, s.Seq)
		buf = appendString(buf, s.Result)
	}
	return buf
}

func appendString(buf []byte, s string) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
	return append(buf, s...)
}

// decodeKVApp rebuilds a state from encode's output.
func decodeKVApp(b []byte) (*kvApp, error) {
	d := decoder{b: b}
	a := newKVApp()
	a.applied = paxos.Slot(d.u64())
	nk := d.u32()
	for i := uint32(0); i < nk && d.err == nil; i++ {
		k := d.str()
		a.data[k] = d.str()
	}
	nm := d.u32()
	for i := uint32(0); i < nm && d.err == nil; i++ {
		a.members = append(a.members, paxos.NodeID(d.u64()))
	}
	nl := d.u32()
	for i := uint32(0); i < nl && d.err == nil; i++ {
		a.learners = append(a.learners, paxos.NodeID(d.u64()))
	}
	nc := d.u32()
	for i := uint32(0); i < nc && d.err == nil; i++ {
		c := d.u32()
		seq := d.u64()
		a.sessions[c] = session{Seq: seq, Result: d.str()}
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return nil, fmt.Errorf("decoding kv snapshot: %w", d.err)
	}
	return a, nil
}

// hash fingerprints the state (data, membership and sessions; applied is
// the map key the checker files it under).
func (a *kvApp) hash() uint64 {
	h := fnv.New64a()
	enc := a.encode()
	h.Write(enc[8:])
	return h.Sum64()
}

type decoder struct {
	b   []byte
	err error
}

var errShort = errors.New("short buffer")

func (d *decoder) u32() uint32 {
	if d.err != nil || len(d.b) < 4 {
		d.err = errShort
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) u64() uint64 {
	if d.err != nil || len(d.b) < 8 {
		d.err = errShort
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) str() string {
	n := d.u32()
	if d.err != nil || uint32(len(d.b)) < n {
		d.err = errShort
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
