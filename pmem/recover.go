package pmem

import (
	"errors"
	"fmt"
)

// Cut reasons reported in Recovery.CutReason. An empty reason means the
// log ended cleanly.
const (
	CutBadLength     = "record length out of bounds"
	CutChecksum      = "record checksum mismatch"
	CutReserved      = "record reserved bytes not zero"
	CutUnknownType   = "unknown record type"
	CutBadPosition   = "record position mismatch"
	CutGenerationNew = "record generation newer than header"
)

// Recovery decision table. The scan starts at the head position from the
// newest valid meta copy and looks at the record header at position p
// (ring offset o = p mod n). The first matching row decides.
//
//	#  condition at p                                      decision     reported
//	1  p == head + n (the ring is full of valid records)   end          clean
//	2  the 64-byte line at o is all zero                   end          clean (end marker, or never written)
//	3  length > RecordPayloadBytesMax, or the record       cut at p     CutBadLength
//	   would cross the end of the ring, or a pad record
//	   with a non-zero length
//	4  checksum does not match header+payload              cut at p     CutChecksum (torn or corrupt)
//	5  checksum matches, stored position != p, and it      end          clean (stale record of an earlier lap)
//	   is p minus a whole number of laps
//	6  checksum matches, stored position != p otherwise    cut at p     CutBadPosition
//	7  checksum matches, generation < generation of the    end          clean (stale record an earlier
//	   previous record                                                  incarnation wrote beyond a cut)
//	8  checksum matches, generation > header generation    cut at p     CutGenerationNew
//	9  checksum matches, reserved bytes not zero           cut at p     CutReserved
//	10 checksum matches, type 0 or > recordTypeMax         cut at p     CutUnknownType
//	11 valid pad record                                    keep, skip to the next lap
//	12 valid record                                        keep, p += record bytes
//
// Append zeroes the line after its last record (the end marker, unless the
// ring is full) and Persist covers it, so after a clean shutdown the scan
// stops at row 2. Without the marker the tail would point into the stale
// bytes of an earlier lap, which cannot be told from a torn record. Rows 5
// and 7 are stale records that validate; they are ends, not cuts.
// Everything after an end or a cut is never returned, even if some of it
// would validate: it was written after the last record that survived and
// was never persisted as a whole. Persisted records always validate, so a
// cut only ever removes records whose Persist had not returned (or media
// corruption, which the checksum turns into a cut instead of a wrong
// answer). Open replaces a cut tail with an end marker, so a cut is
// reported by the first Open after it only.
//
// A record that was persisted and then entirely zeroed from its first
// line on (a media fault) looks like row 2: without a durable tail
// pointer (one more persist per batch) that case cannot be told apart from
// the end of the log.
//
// CutBytes is the span of the rejected record: its claimed length rounded
// up to 64 bytes and capped at the end of the ring, or one line when the
// length itself is unusable.

// scanResult is what a scan of the ring found.
type scanResult struct {
	records   int    // valid non-pad records
	live      int    // of those, records with Slot >= minSlot
	tailPos   uint64 // position after the last valid record
	cutBytes  int64
	cutReason string
}

// scanRing validates the ring from headPos. ring is the data area (n bytes,
// a multiple of recordAlignBytes). fn, if not nil, is called with the ring
// offset of every valid non-pad record, in order; its payload aliases ring.
func scanRing(ring []byte, seed, headPos, headerGen, minSlot uint64, fn func(off uint64, r Record)) scanResult {
	n := uint64(len(ring))
	p := headPos
	prevGen := uint64(0)
	res := scanResult{}
	for {
		if p-headPos >= n { // row 1
			break
		}
		o := p % n
		line := ring[o : o+lineBytes]
		if allZero(line) { // row 2
			break
		}
		h := getRecordHeader(line)
		size := uint64(recordBytes(int(min(h.length, RecordBytesMax))))
		if h.length > RecordPayloadBytesMax || o+size > n || (h.typ == RecordPad && h.length != 0) { // row 3
			res.cutReason, res.cutBytes = CutBadLength, lineBytes
			break
		}
		if recordSum(seed, ring[o:o+recordHeaderBytes+uint64(h.length)]) != h.sum { // row 4
			res.cutReason, res.cutBytes = CutChecksum, int64(size)
			break
		}
		if h.pos != p {
			if h.pos < p && (p-h.pos)%n == 0 { // row 5
				break
			}
			res.cutReason, res.cutBytes = CutBadPosition, int64(size) // row 6
			break
		}
		if h.generation < prevGen { // row 7
			break
		}
		if h.generation > headerGen { // row 8
			res.cutReason, res.cutBytes = CutGenerationNew, int64(size)
			break
		}
		if h.reserved != [3]byte{} { // row 9
			res.cutReason, res.cutBytes = CutReserved, int64(size)
			break
		}
		if h.typ == 0 || h.typ > recordTypeMax { // row 10
			res.cutReason, res.cutBytes = CutUnknownType, int64(size)
			break
		}
		prevGen = h.generation
		if h.typ == RecordPad { // row 11
			p += n - o
			continue
		}
		res.records++ // row 12
		if h.slot >= minSlot {
			res.live++
		}
		if fn != nil {
			fn(o, Record{Type: h.typ, Slot: h.slot, Ballot: h.ballot,
				Payload: ring[o+recordHeaderBytes : o+recordHeaderBytes+uint64(h.length)]})
		}
		p += size
	}
	res.tailPos = p
	return res
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Header errors. Unlike a bad record tail these are not cut: a region with
// a bad header is refused, because guessing could lose promises.
var (
	// ErrNotLog: the region does not start with Magic (and is not blank).
	ErrNotLog = errors.New("pmem: region is not a synod pmem log (bad magic)")
	// ErrHeaderCorrupt: the identity line or both meta copies fail their
	// checksums.
	ErrHeaderCorrupt = errors.New("pmem: region header corrupt")
	// ErrVersion: the region was written by another format version.
	ErrVersion = errors.New("pmem: unsupported format version")
	// ErrIdentity: the region belongs to another cluster or node.
	ErrIdentity = errors.New("pmem: region belongs to another cluster or node")
)

// regionState is everything recovery derives from a region's bytes.
type regionState struct {
	id   identity
	meta meta // the newest valid copy
	// metaIndex is the copy (0 or 1) that holds meta.
	metaIndex int
	scan      scanResult
}

// unformatted reports whether the region's format never completed: format
// persists the whole header with the magic zeroed and only then stores the
// magic (one aligned 8-byte store), so a zero magic means an interrupted
// format, unless a meta copy shows the log was opened before (generation
// >= 1): then the magic was zeroed by a fault, and reformatting would make
// the acceptor forget its promises.
func unformatted(mem []byte) bool {
	if len(mem) < headerBytes || !allZero(mem[identityOffset:identityOffset+8]) {
		return false
	}
	return !usedMeta(mem)
}

// usedMeta reports whether a meta copy validates with the identity line's
// seed and has a generation of at least 1.
func usedMeta(mem []byte) bool {
	id, _, _ := decodeIdentity(mem[identityOffset:])
	for _, off := range []int{metaOffset0, metaOffset1} {
		if m, ok := decodeMeta(mem[off:], id.seed); ok && m.generation >= 1 {
			return true
		}
	}
	return false
}

// recoverRegion validates the header of mem and scans its ring. It never
// panics, whatever mem holds; it returns an error for a header it cannot
// trust.
func recoverRegion(mem []byte, clusterID, nodeID uint64, fn func(off uint64, r Record)) (regionState, error) {
	var st regionState
	if len(mem) < headerBytes+lineBytes {
		return st, fmt.Errorf("%w: region of %d bytes is smaller than its header", ErrHeaderCorrupt, len(mem))
	}
	id, magicOK, sumOK := decodeIdentity(mem[identityOffset:])
	switch {
	case !magicOK && allZero(mem[identityOffset:identityOffset+8]) && usedMeta(mem):
		return st, fmt.Errorf("%w: magic zeroed on a log that was opened before", ErrHeaderCorrupt)
	case !magicOK:
		return st, ErrNotLog
	case !sumOK:
		return st, fmt.Errorf("%w: identity checksum mismatch", ErrHeaderCorrupt)
	case id.version != FormatVersion:
		return st, fmt.Errorf("%w: region has version %d, this build reads %d", ErrVersion, id.version, FormatVersion)
	case id.clusterID != clusterID || id.nodeID != nodeID:
		return st, fmt.Errorf("%w: region is cluster %d node %d, opened as cluster %d node %d",
			ErrIdentity, id.clusterID, id.nodeID, clusterID, nodeID)
	case id.regionBytes != uint64(len(mem)):
		return st, fmt.Errorf("%w: header says %d bytes, region has %d", ErrHeaderCorrupt, id.regionBytes, len(mem))
	case id.regionBytes < RegionBytesMin || id.regionBytes > RegionBytesMax || id.regionBytes%RegionAlignBytes != 0:
		return st, fmt.Errorf("%w: region size %d out of bounds", ErrHeaderCorrupt, id.regionBytes)
	}
	st.id = id
	m0, ok0 := decodeMeta(mem[metaOffset0:], id.seed)
	m1, ok1 := decodeMeta(mem[metaOffset1:], id.seed)
	switch {
	case ok0 && (!ok1 || m0.seq > m1.seq):
		st.meta, st.metaIndex = m0, 0
	case ok1:
		st.meta, st.metaIndex = m1, 1
	default:
		return st, fmt.Errorf("%w: both meta copies fail their checksums", ErrHeaderCorrupt)
	}
	ring := mem[headerBytes:]
	if st.meta.headPos%recordAlignBytes != 0 {
		return st, fmt.Errorf("%w: head position %d not aligned", ErrHeaderCorrupt, st.meta.headPos)
	}
	st.scan = scanRing(ring, id.seed, st.meta.headPos, st.meta.generation, st.meta.truncatedBelow, fn)
	return st, nil
}
