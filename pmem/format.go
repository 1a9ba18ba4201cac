package pmem

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// Format constants. Changing any of them changes the on-media format and
// needs a new FormatVersion.
const (
	// Magic opens every region.
	Magic = "SYNODPML"
	// FormatVersion is the version of the layout described in the package
	// comment.
	FormatVersion uint32 = 1

	headerBytes       = 4096 // identity line, two meta copies, zero padding
	identityOffset    = 0
	metaOffset0       = 64
	metaOffset1       = 128
	lineBytes         = 64 // a cache line, the unit of an atomic-ish persist
	recordHeaderBytes = 56
	recordAlignBytes  = 64
)

// Limits. They are not part of the format, but shrinking one can make an
// existing log unreadable.
const (
	// RecordBytesMax is the largest record, header and padding included.
	RecordBytesMax = 1 << 20
	// RecordPayloadBytesMax is the largest payload of one record.
	RecordPayloadBytesMax = RecordBytesMax - recordHeaderBytes
	// RegionHeaderBytes is what a region holds before its data ring: a
	// region of n bytes has a ring of n - RegionHeaderBytes.
	RegionHeaderBytes = headerBytes
	// RegionBytesMin is the smallest region Open accepts.
	RegionBytesMin = 64 << 10
	// RegionBytesMax is the largest region Open accepts.
	RegionBytesMax = 1 << 40
	// RegionAlignBytes is the unit a region size must be a multiple of
	// (kvnode checks pmem.size_bytes against it).
	RegionAlignBytes = 4096
	// AppendBatchRecordsMax is the most records one Append call takes.
	AppendBatchRecordsMax = 4096
)

// RecordType says what a record holds. The values are part of the format.
type RecordType uint8

const (
	// RecordEntry is an accepted value: Slot, Ballot and the opaque payload.
	RecordEntry RecordType = 1
	// RecordPad fills the end of the ring when the next record does not fit
	// there. It is internal: Append refuses it and Iterate skips it.
	RecordPad RecordType = 2
	// RecordSnapshotMark is an opaque caller record (for example: "a
	// snapshot covers slots below Slot"). The log gives it no meaning.
	RecordSnapshotMark RecordType = 3

	recordTypeMax = RecordSnapshotMark
)

func (t RecordType) String() string {
	switch t {
	case RecordEntry:
		return "entry"
	case RecordPad:
		return "pad"
	case RecordSnapshotMark:
		return "snapshot-mark"
	}
	return "unknown"
}

// Ballot orders proposals: Round first, then Node.
type Ballot struct{ Round, Node uint64 }

// Less reports whether b orders before o.
func (b Ballot) Less(o Ballot) bool {
	return b.Round < o.Round || (b.Round == o.Round && b.Node < o.Node)
}

// Record is one log record. Payload is opaque to this package.
type Record struct {
	Type    RecordType
	Slot    uint64
	Ballot  Ballot
	Payload []byte
}

// identity is the decoded identity line.
type identity struct {
	version     uint32
	clusterID   uint64
	nodeID      uint64
	regionBytes uint64
	seed        uint64
}

func encodeIdentity(b []byte, id identity) {
	_ = b[lineBytes-1]
	clear(b[:lineBytes])
	copy(b[0:8], Magic)
	binary.LittleEndian.PutUint32(b[8:], id.version)
	binary.LittleEndian.PutUint64(b[16:], id.clusterID)
	binary.LittleEndian.PutUint64(b[24:], id.nodeID)
	binary.LittleEndian.PutUint64(b[32:], id.regionBytes)
	binary.LittleEndian.PutUint64(b[40:], id.seed)
	binary.LittleEndian.PutUint64(b[56:], xxhash.Sum64(b[0:56]))
}

// decodeIdentity returns the identity line and whether its magic and
// checksum hold.
func decodeIdentity(b []byte) (id identity, magicOK, sumOK bool) {
	_ = b[lineBytes-1]
	magicOK = string(b[0:8]) == Magic
	sumOK = binary.LittleEndian.Uint64(b[56:]) == xxhash.Sum64(b[0:56])
	id = identity{
		version:     binary.LittleEndian.Uint32(b[8:]),
		clusterID:   binary.LittleEndian.Uint64(b[16:]),
		nodeID:      binary.LittleEndian.Uint64(b[24:]),
		regionBytes: binary.LittleEndian.Uint64(b[32:]),
		seed:        binary.LittleEndian.Uint64(b[40:]),
	}
	return id, magicOK, sumOK
}

// meta is the decoded mutable header state.
type meta struct {
	seq            uint64
	promised       Ballot
	headPos        uint64
	truncatedBelow uint64
	generation     uint64
	// chosen is the caller's hint that every record of a slot at or
	// below it holds a chosen value (Log.NoteChosen); 0: none. Bytes
	// 56-63 were zero before it: a log written earlier reads 0, and an
	// earlier reader ignores it (the checksum covers them either way).
	chosen uint64
}

func seededSum(seed uint64, parts ...[]byte) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	for _, p := range parts {
		_, _ = d.Write(p)
	}
	return d.Sum64()
}

func encodeMeta(b []byte, seed uint64, m meta) {
	_ = b[lineBytes-1]
	binary.LittleEndian.PutUint64(b[8:], m.seq)
	binary.LittleEndian.PutUint64(b[16:], m.promised.Round)
	binary.LittleEndian.PutUint64(b[24:], m.promised.Node)
	binary.LittleEndian.PutUint64(b[32:], m.headPos)
	binary.LittleEndian.PutUint64(b[40:], m.truncatedBelow)
	binary.LittleEndian.PutUint64(b[48:], m.generation)
	binary.LittleEndian.PutUint64(b[56:], m.chosen)
	binary.LittleEndian.PutUint64(b[0:], seededSum(seed, b[8:lineBytes]))
}

// decodeMeta returns the meta copy and whether its checksum holds.
func decodeMeta(b []byte, seed uint64) (meta, bool) {
	_ = b[lineBytes-1]
	ok := binary.LittleEndian.Uint64(b[0:]) == seededSum(seed, b[8:lineBytes])
	return meta{
		seq:            binary.LittleEndian.Uint64(b[8:]),
		promised:       Ballot{binary.LittleEndian.Uint64(b[16:]), binary.LittleEndian.Uint64(b[24:])},
		headPos:        binary.LittleEndian.Uint64(b[32:]),
		truncatedBelow: binary.LittleEndian.Uint64(b[40:]),
		generation:     binary.LittleEndian.Uint64(b[48:]),
		chosen:         binary.LittleEndian.Uint64(b[56:]),
	}, ok
}

// recordHeader is a decoded record header.
type recordHeader struct {
	sum        uint64
	length     uint32
	typ        RecordType
	reserved   [3]byte
	slot       uint64
	ballot     Ballot
	pos        uint64
	generation uint64
}

// recordBytes is the ring space a record with a payload of n bytes takes.
func recordBytes(n int) int64 {
	return (int64(n) + recordHeaderBytes + recordAlignBytes - 1) &^ (recordAlignBytes - 1)
}

// putRecord writes the header and payload into b (which must hold
// recordBytes(len(payload)) bytes) and stamps the checksum last. The
// padding after the payload is left as it is: the checksum does not cover
// it.
func putRecord(b []byte, seed uint64, h recordHeader, payload []byte) {
	_ = b[recordHeaderBytes+len(payload)-1]
	binary.LittleEndian.PutUint32(b[8:], uint32(len(payload)))
	b[12] = byte(h.typ)
	b[13], b[14], b[15] = 0, 0, 0
	binary.LittleEndian.PutUint64(b[16:], h.slot)
	binary.LittleEndian.PutUint64(b[24:], h.ballot.Round)
	binary.LittleEndian.PutUint64(b[32:], h.ballot.Node)
	binary.LittleEndian.PutUint64(b[40:], h.pos)
	binary.LittleEndian.PutUint64(b[48:], h.generation)
	copy(b[recordHeaderBytes:], payload)
	binary.LittleEndian.PutUint64(b[0:], recordSum(seed, b[:recordHeaderBytes+len(payload)]))
}

// recordSum is the checksum of an encoded record (header and payload).
func recordSum(seed uint64, rec []byte) uint64 {
	return seededSum(seed, rec[8:])
}

func getRecordHeader(b []byte) recordHeader {
	_ = b[recordHeaderBytes-1]
	return recordHeader{
		sum:        binary.LittleEndian.Uint64(b[0:]),
		length:     binary.LittleEndian.Uint32(b[8:]),
		typ:        RecordType(b[12]),
		reserved:   [3]byte{b[13], b[14], b[15]},
		slot:       binary.LittleEndian.Uint64(b[16:]),
		ballot:     Ballot{binary.LittleEndian.Uint64(b[24:]), binary.LittleEndian.Uint64(b[32:])},
		pos:        binary.LittleEndian.Uint64(b[40:]),
		generation: binary.LittleEndian.Uint64(b[48:]),
	}
}

// RecordBytes is the ring space a record with a payload of n bytes takes
// (its header and alignment included): what Space counts for it.
func RecordBytes(n int) int64 { return recordBytes(n) }
