// Package backup is synod's backup file: a state-machine snapshot stream
// (kv/sm) of a whole cluster, wrapped with what a new cluster needs to
// know about it and a checksum over every byte. `kvctl snapshot save`
// writes one (the leader's admin endpoint produces it, GET /snapshot),
// `kvctl snapshot status` checks and describes one, and `kvnode restore`
// creates a new cluster's data directories from one.
//
// File layout (all integers big-endian; the constants are part of the
// format):
//
//	offset  size  field
//	0       8     magic "SYNODBAK"
//	8       2     format version (FormatVersion = 1)
//	10      4     header body bytes, H (at most HeaderBodyBytesMax)
//	14      H     header body:
//	                cluster id u64       the cluster the snapshot was taken from
//	                slot u64             the applied slot the snapshot reflects
//	                created u64          unix milliseconds, the answering node's clock
//	                members format u8    MembersFormatIDs (1): ids only
//	                member count u16     1..MembersMax
//	                count x member       format 1: id u64, ascending, non-zero
//	14+H    S     the kv/sm snapshot stream, as sm.SM.Snapshot produces it
//	14+H+S  8     trailer magic "SYNODEND"
//	        8     S, the snapshot stream's length
//	        32    SHA-256 of every byte before it (magic through S)
//
// The membership is the answering node's (paxos Status().Members) when
// the snapshot was taken; the members format byte lets a later version
// carry more per member (addresses) without a new file version. A
// version-1 reader refuses any other format version or members format.
//
// Verify checks a file completely, in an order that names the damage: not
// a backup at all (magic), a version it does not read, a file cut short
// (size, trailer), any changed byte (checksum), and last what only a buggy
// writer could produce with a valid checksum (header fields, the stream's
// own records, count and checksum, its slot against the header's).
package backup

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"time"

	"synod/kv/sm"
	"synod/paxos"
)

// Format constants.
const (
	Magic            = "SYNODBAK"
	TrailerMagic     = "SYNODEND"
	FormatVersion    = uint16(1)
	MembersFormatIDs = uint8(1)
	// MembersMax bounds the members a header lists (a group's bound).
	MembersMax = paxos.MembersMax
	// HeaderBodyBytesMax bounds the header body: room for MembersMax
	// members with an address each in a later members format.
	HeaderBodyBytesMax = 64 << 10
	// prefixBytes is magic, version and header body length.
	prefixBytes = 8 + 2 + 4
	// TrailerBytes is the trailer: magic, stream length, SHA-256.
	TrailerBytes = 8 + 8 + sha256.Size
	// headerBodyBytesMin is a version-1 body with one member.
	headerBodyBytesMin = 8 + 8 + 8 + 1 + 2 + 8
	// MinFileBytes is the smallest file that can be a backup.
	MinFileBytes = prefixBytes + headerBodyBytesMin + TrailerBytes
	// hashBufferBytes is the read buffer of the checksum pass.
	hashBufferBytes = 256 << 10
)

// Errors. Every error Verify returns wraps ErrBadBackup and one of the
// others, which say what is wrong.
var (
	ErrBadBackup = errors.New("backup: bad backup file")
	ErrNotBackup = errors.New("not a synod backup file")
	ErrVersion   = errors.New("unsupported format version")
	ErrTruncated = errors.New("truncated")
	ErrChecksum  = errors.New("checksum mismatch")
	ErrMalformed = errors.New("malformed")
)

func badf(kind error, format string, args ...any) error {
	return fmt.Errorf("%w: %w: "+format, append([]any{ErrBadBackup, kind}, args...)...)
}

// Header is what a backup file says about its snapshot.
type Header struct {
	ClusterID uint64
	Slot      uint64
	Created   time.Time // millisecond resolution
	// MembersFormat says how members are stored (MembersFormatIDs).
	MembersFormat uint8
	Members       []uint64
}

func (h *Header) validate() error {
	switch {
	case h.MembersFormat != MembersFormatIDs:
		return fmt.Errorf("members format %d (this build reads %d)", h.MembersFormat, MembersFormatIDs)
	case len(h.Members) == 0 || len(h.Members) > MembersMax:
		return fmt.Errorf("%d members, want 1..%d", len(h.Members), MembersMax)
	case h.Created.UnixMilli() < 0:
		return fmt.Errorf("created %v is before 1970", h.Created)
	}
	for i, id := range h.Members {
		if id == 0 || (i > 0 && id <= h.Members[i-1]) {
			return fmt.Errorf("member ids %v are not ascending non-zero ids", h.Members)
		}
	}
	return nil
}

func (h *Header) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, h.ClusterID)
	b = binary.BigEndian.AppendUint64(b, h.Slot)
	b = binary.BigEndian.AppendUint64(b, uint64(h.Created.UnixMilli()))
	b = append(b, h.MembersFormat)
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.Members)))
	for _, id := range h.Members {
		b = binary.BigEndian.AppendUint64(b, id)
	}
	return b
}

// parseBody decodes a header body (the format version is already
// checked).
func parseBody(b []byte) (Header, error) {
	var h Header
	if len(b) < headerBodyBytesMin {
		return h, fmt.Errorf("header body of %d bytes, at least %d", len(b), headerBodyBytesMin)
	}
	h.ClusterID = binary.BigEndian.Uint64(b)
	h.Slot = binary.BigEndian.Uint64(b[8:])
	ms := binary.BigEndian.Uint64(b[16:])
	if ms > math.MaxInt64 {
		return h, fmt.Errorf("created %d ms is out of range", ms)
	}
	h.Created = time.UnixMilli(int64(ms)).UTC()
	h.MembersFormat = b[24]
	n := int(binary.BigEndian.Uint16(b[25:]))
	rest := b[27:]
	if h.MembersFormat != MembersFormatIDs {
		return h, fmt.Errorf("members format %d (this build reads %d)", h.MembersFormat, MembersFormatIDs)
	}
	if n == 0 || n > MembersMax {
		return h, fmt.Errorf("%d members, want 1..%d", n, MembersMax)
	}
	if len(rest) != 8*n {
		return h, fmt.Errorf("%d bytes of members for %d ids", len(rest), n)
	}
	h.Members = make([]uint64, n)
	for i := range h.Members {
		h.Members[i] = binary.BigEndian.Uint64(rest[8*i:])
	}
	return h, h.validate()
}

// Write writes a whole backup file to w: the header h, the snapshot
// stream read from stream to its end, and the trailer. It returns the
// bytes written. h.Created is truncated to milliseconds; h.MembersFormat
// 0 means MembersFormatIDs. A stream that fails mid-way leaves w without
// a trailer, which Verify refuses as truncated.
func Write(w io.Writer, h Header, stream io.Reader) (int64, error) {
	if h.MembersFormat == 0 {
		h.MembersFormat = MembersFormatIDs
	}
	if err := h.validate(); err != nil {
		return 0, fmt.Errorf("backup: writing: %w", err)
	}
	body := h.appendBody(nil)
	if len(body) > HeaderBodyBytesMax {
		return 0, fmt.Errorf("backup: writing: header body of %d bytes exceeds %d", len(body), HeaderBodyBytesMax)
	}
	sum := sha256.New()
	cw := &countWriter{w: io.MultiWriter(w, sum)}
	prefix := append([]byte(Magic), 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint16(prefix[8:], FormatVersion)
	binary.BigEndian.PutUint32(prefix[10:], uint32(len(body)))
	if _, err := cw.Write(append(prefix, body...)); err != nil {
		return cw.n, fmt.Errorf("backup: writing the header: %w", err)
	}
	headerEnd := cw.n
	if _, err := io.Copy(cw, stream); err != nil {
		return cw.n, fmt.Errorf("backup: writing the snapshot stream: %w", err)
	}
	trailer := append([]byte(TrailerMagic), binary.BigEndian.AppendUint64(nil, uint64(cw.n-headerEnd))...)
	if _, err := cw.Write(trailer); err != nil {
		return cw.n, fmt.Errorf("backup: writing the trailer: %w", err)
	}
	n, err := w.Write(sum.Sum(nil))
	if err != nil {
		return cw.n + int64(n), fmt.Errorf("backup: writing the checksum: %w", err)
	}
	return cw.n + int64(n), nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Info is what Verify found in a backup file.
type Info struct {
	Header
	Version      uint16
	FileBytes    int64
	StreamOffset int64 // where the snapshot stream starts
	StreamBytes  int64
	SHA256       [sha256.Size]byte
	Snapshot     sm.SnapshotInfo
}

// Stream returns a reader of exactly the snapshot stream of the file r
// that Verify described as info (what sm.SM.Restore takes).
func (info *Info) Stream(r io.ReaderAt) io.Reader {
	return io.NewSectionReader(r, info.StreamOffset, info.StreamBytes)
}

// VerifyFile is Verify of the file at path.
func VerifyFile(path string) (*Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return Verify(f, st.Size())
}

// Verify checks the size bytes of r as a backup file, completely (see the
// package doc for the order), and describes it. Every error wraps
// ErrBadBackup and one of ErrNotBackup, ErrVersion, ErrTruncated,
// ErrChecksum or ErrMalformed, except errors reading r.
func Verify(r io.ReaderAt, size int64) (*Info, error) {
	info := &Info{FileBytes: size}
	var prefix [prefixBytes]byte
	n, err := r.ReadAt(prefix[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("backup: reading: %w", err)
	}
	if n < len(Magic) && string(prefix[:n]) == Magic[:n] {
		return nil, badf(ErrTruncated, "%d bytes, shorter than the smallest backup (%d)", size, MinFileBytes)
	}
	if n < len(Magic) || string(prefix[:len(Magic)]) != Magic {
		return nil, badf(ErrNotBackup, "magic %q, want %q", prefix[:min(n, len(Magic))], Magic)
	}
	if n == len(prefix) {
		info.Version = binary.BigEndian.Uint16(prefix[8:])
		if info.Version != FormatVersion {
			return nil, badf(ErrVersion, "format version %d (this build reads version %d)", info.Version, FormatVersion)
		}
	}
	if size < MinFileBytes {
		return nil, badf(ErrTruncated, "%d bytes, shorter than the smallest backup (%d)", size, MinFileBytes)
	}
	bodyLen := int64(binary.BigEndian.Uint32(prefix[10:]))
	if bodyLen > HeaderBodyBytesMax {
		return nil, badf(ErrMalformed, "header body of %d bytes exceeds %d", bodyLen, HeaderBodyBytesMax)
	}
	info.StreamOffset = prefixBytes + bodyLen
	if info.StreamOffset+TrailerBytes > size {
		return nil, badf(ErrTruncated, "%d bytes, shorter than its header (%d) and trailer", size, info.StreamOffset)
	}
	var trailer [TrailerBytes]byte
	if _, err := r.ReadAt(trailer[:], size-TrailerBytes); err != nil {
		return nil, fmt.Errorf("backup: reading the trailer: %w", err)
	}
	if string(trailer[:len(TrailerMagic)]) != TrailerMagic {
		return nil, badf(ErrTruncated, "the file does not end with the backup trailer (cut short, or damaged at the end)")
	}

	// Every byte but the checksum itself, against the checksum.
	sum := sha256.New()
	if _, err := io.CopyBuffer(sum, io.NewSectionReader(r, 0, size-sha256.Size), make([]byte, hashBufferBytes)); err != nil {
		return nil, fmt.Errorf("backup: reading: %w", err)
	}
	copy(info.SHA256[:], sum.Sum(nil))
	if stored := trailer[16:]; !bytes.Equal(stored, info.SHA256[:]) {
		return nil, badf(ErrChecksum, "the file is damaged: SHA-256 %x, the trailer says %x", info.SHA256, stored)
	}

	// The checksum holds: what follows can only fail for a file a buggy
	// (or hostile) writer sealed.
	body := make([]byte, bodyLen)
	if _, err := r.ReadAt(body, prefixBytes); err != nil {
		return nil, fmt.Errorf("backup: reading the header: %w", err)
	}
	if info.Header, err = parseBody(body); err != nil {
		return nil, badf(ErrMalformed, "header: %v", err)
	}
	info.StreamBytes = size - TrailerBytes - info.StreamOffset
	if got := binary.BigEndian.Uint64(trailer[8:]); got != uint64(info.StreamBytes) {
		return nil, badf(ErrMalformed, "the trailer counts %d snapshot stream bytes, the file holds %d", got, info.StreamBytes)
	}
	if info.Snapshot, err = sm.VerifySnapshot(info.Stream(r)); err != nil {
		return nil, badf(ErrMalformed, "snapshot stream: %v", err)
	}
	if info.Snapshot.Slot != info.Slot {
		return nil, badf(ErrMalformed, "header slot %d, snapshot stream slot %d", info.Slot, info.Snapshot.Slot)
	}
	return info, nil
}

// MemberIDs converts paxos ids to the header's, ascending.
func MemberIDs(ids []paxos.NodeID) []uint64 {
	out := make([]uint64, len(ids))
	for i, id := range ids {
		out[i] = uint64(id)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
