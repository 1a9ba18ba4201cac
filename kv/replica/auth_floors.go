package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"

	"synod/kv/proto"
	"synod/paxos"
)

// Replay floors: what a restarted receiver remembers of its replay
// windows.
//
// The windows (auth.go) live in memory, so a receiver that restarted took
// as fresh any packet captured from a sender's current process before the
// restart (an outside attacker replayed 222 captured datagrams to a
// follower the moment it was back: all accepted). So a node records, per
// sender and channel, the incarnation and the highest counter it accepted
// (Floors); kvnode writes them to data_dir every authFloorsPersistEvery
// and at a clean stop, and a restart starts each window from its record
// (SetFloors): a counter at or below it, from that incarnation or an older
// one, is refused. What is left: packets accepted within the last
// authFloorsPersistEvery before a crash (the record is that old) can be
// replayed once after it; Paxos takes duplicated and delayed messages
// anyway, and each payload names its receiver, so such a replay does no
// more than the network itself may.

// AuthFloor is one window's record: the highest counter accepted from
// Sender's Incarnation on Channel.
type AuthFloor struct {
	Sender      paxos.NodeID
	Channel     byte
	Incarnation uint64
	Counter     uint64
}

// authFloorsMax bounds the records a floors file may hold: every member
// id (1..proto.MemberIDMax) on every channel.
const authFloorsMax = proto.MemberIDMax * (authChannelMax + 1)

// authFloorsMagic opens the encoded floors (version 1).
const authFloorsMagic = "SYNODAF1"

const authFloorBytes = 8 + 1 + 8 + 8

// TestingNoAuthFloors, when set, plants the receiver without floors
// (SetFloors does nothing): a restart accepts captured packets again.
var TestingNoAuthFloors bool

// AuthFloorsBytesMax is the largest encoded floors record (what a reader
// of the file needs to read at most).
const AuthFloorsBytesMax = len(authFloorsMagic) + 4 + authFloorsMax*authFloorBytes + 4

// Floors returns the current windows' records, ordered by sender and
// channel.
func (a *Auth) Floors() []AuthFloor {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]AuthFloor, 0, len(a.windows))
	for k, w := range a.windows {
		out = append(out, AuthFloor{Sender: k.sender, Channel: k.channel, Incarnation: w.incarnation, Counter: w.top})
	}
	slices.SortFunc(out, func(x, y AuthFloor) int {
		if x.Sender != y.Sender {
			return int(x.Sender) - int(y.Sender)
		}
		return int(x.Channel) - int(y.Channel)
	})
	return out
}

// SetFloors raises the windows to the records (a restart, before any
// packet is opened): every counter at or below a record's, of its
// incarnation, counts as seen, and older incarnations as refused.
func (a *Auth) SetFloors(fs []AuthFloor) {
	if TestingNoAuthFloors {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, f := range fs {
		k := windowKey{f.Sender, f.Channel}
		w := a.windows[k]
		switch {
		case w == nil || f.Incarnation > w.incarnation:
			a.windows[k] = &replayWindow{incarnation: f.Incarnation, top: f.Counter, seen: ^uint64(0)}
		case f.Incarnation == w.incarnation && f.Counter > w.top:
			w.top, w.seen = f.Counter, ^uint64(0)
		}
	}
}

// EncodeAuthFloors encodes fs: authFloorsMagic, a u32 count, the records
// (sender u64, channel u8, incarnation u64, counter u64), and a CRC-32C
// of everything before it; little endian.
func EncodeAuthFloors(fs []AuthFloor) []byte {
	b := make([]byte, 0, len(authFloorsMagic)+4+len(fs)*authFloorBytes+4)
	b = append(b, authFloorsMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(fs)))
	for _, f := range fs {
		b = binary.LittleEndian.AppendUint64(b, uint64(f.Sender))
		b = append(b, f.Channel)
		b = binary.LittleEndian.AppendUint64(b, f.Incarnation)
		b = binary.LittleEndian.AppendUint64(b, f.Counter)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

var errAuthFloors = errors.New("replica: malformed replay floors")

// DecodeAuthFloors decodes what EncodeAuthFloors wrote. Anything else (a
// wrong magic, length or checksum, more than authFloorsMax records, a
// sender 0 or above proto.MemberIDMax, an unknown channel) is an error.
func DecodeAuthFloors(b []byte) ([]AuthFloor, error) {
	head := len(authFloorsMagic) + 4
	if len(b) < head+4 || string(b[:len(authFloorsMagic)]) != authFloorsMagic {
		return nil, fmt.Errorf("%w: not a floors record (%d bytes)", errAuthFloors, len(b))
	}
	n := binary.LittleEndian.Uint32(b[len(authFloorsMagic):head])
	if n > authFloorsMax || len(b) != head+int(n)*authFloorBytes+4 {
		return nil, fmt.Errorf("%w: %d records in %d bytes", errAuthFloors, n, len(b))
	}
	if crc32.Checksum(b[:len(b)-4], crcTable) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, fmt.Errorf("%w: checksum mismatch", errAuthFloors)
	}
	out := make([]AuthFloor, 0, n)
	for off := head; off < len(b)-4; off += authFloorBytes {
		f := AuthFloor{
			Sender:      paxos.NodeID(binary.LittleEndian.Uint64(b[off:])),
			Channel:     b[off+8],
			Incarnation: binary.LittleEndian.Uint64(b[off+9:]),
			Counter:     binary.LittleEndian.Uint64(b[off+17:]),
		}
		if f.Sender == 0 || f.Sender > proto.MemberIDMax || f.Channel > authChannelMax {
			return nil, fmt.Errorf("%w: record of sender %d on channel %d", errAuthFloors, f.Sender, f.Channel)
		}
		out = append(out, f)
	}
	return out, nil
}
