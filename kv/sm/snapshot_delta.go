package sm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/cockroachdb/pebble/v2"

	"synod/kv/proto"
)

// Delta snapshots. A follower that was down for a minute of a 10 GiB store
// lacks a few hundred MB of it, but a whole-state snapshot sends all of it
// again (318 s on this machine under load). A delta transfer sends only
// the key ranges that differ:
//
//  1. the fetcher stages from a Pebble checkpoint of its own live state
//     (hard links: O(files), no copy) instead of an empty directory, and
//     cuts that static copy into ranges of about deltaRangeBytes in key
//     order, hashing each: the digest (its encoding below; at most
//     deltaRangesMax ranges and DeltaDigestBytesMax bytes: past either
//     the last range runs to the end of the keyspace);
//  2. it sends the digest with its request; the server hashes the same
//     ranges of its own state (a Pebble snapshot, as for a whole one) and
//     streams, range by range, "keep" where the hashes match and
//     "replace" followed by every record of the range where they do not;
//  3. the fetcher deletes a replaced range from its staged copy and
//     writes the server's records in (ingested sstables, as a whole
//     stream is: snapshot_ingest.go); a kept range stays as it was.
//
// The end record carries, besides the stream's count and checksum, the
// xxhash64 of the server's range hashes in order (the state hash). The
// fetcher computes the same over its own hash of each kept range and the
// hash of the records it received for each replaced one: equal only when
// the staged copy holds what the server holds, range by range (a server
// that kept a range that differs fails here: TestDeltaCatchesWrongKeep).
// So a delta restore is verified as a whole stream is, up to a 64-bit
// hash collision per range; then Finish, the marker, the swap and every
// crash rule are those of "Staged restores" (snapshot_stage.go): the
// staged copy is a separate directory until it is complete.
//
// It helps when writes since the follower's state touch few ranges (keys
// that grow with time, as kvbench's load writes them); writes spread
// uniformly over the keyspace touch every range, and the transfer is then
// a whole one plus two hashing passes.
//
// Digest (the fetcher's ranges; little endian):
//
//	version u8 = 1 | ranges u32 | per range: start length u16 | start | hash u64
//
// The first range starts at the empty key; each start is above the one
// before and below the keyspace's end; range i ends where i+1 starts, the
// last at the end of the keyspace. The fetcher ends its digest with an
// empty range above its last key (when the limits leave room): a server
// whose keyspace grew at its end finds there a range the fetcher does not
// hold at all, which it sends in one pass, hashing as it goes, instead of
// hashing it first and reading it again.
//
// Delta stream (big endian, as the whole stream):
//
//	magic "SYNODSD\x01" | applied slot u64 | ranges u32
//	per range, in order: kind u8 = 2 (keep)
//	                 or: kind u8 = 3 (replace), then its records (kind 1, as in snapshot.go)
//	anywhere before the end: kind u8 = 4 (nothing: the server is still hashing)
//	end: kind u8 = 0 | record count u64 | xxhash64 of every byte before the end record | state hash u64
var deltaMagic = []byte("SYNODSD\x01")

const (
	deltaKeep    = 2
	deltaReplace = 3
	// deltaNoop carries nothing: the server writes one (and hands the
	// stream on) at least every deltaFlushEvery while it hashes a long
	// range, so that the fetcher, which gives up after seconds without a
	// frame, hears from it.
	deltaNoop = 4

	deltaDigestVersion = 1
	// deltaRangeBytesDefault is the key and value bytes per digest range:
	// 2,560 ranges at 10 GiB (~100 KB of digest); a replaced range costs
	// the server a second pass over it.
	deltaRangeBytesDefault = 4 << 20
	// deltaRangesMax bounds a digest's ranges.
	deltaRangesMax = 16384
	// DeltaDigestBytesMax bounds an encoded digest (it travels in one
	// request frame).
	DeltaDigestBytesMax = 512 << 10
	// deltaLastKeyReserve is room for the last range's last key, which
	// the digest's holder keeps too: the longest key the SM stores.
	deltaLastKeyReserve = 4 + proto.KeyBytesMax
	// deltaFlushEveryDefault: while the server hashes, it hands what it
	// encoded (a no-op when nothing else) to the stream at least this
	// often, so that the fetcher (which gives up after seconds without a
	// frame) hears from it.
	deltaFlushEveryDefault = 500 * time.Millisecond
	// deltaDigestRangeBytesMin is an encoded range's smallest size.
	deltaDigestRangeBytesMin = 2 + 8
)

// deltaRangeBytes and deltaFlushEvery are their defaults; tests shrink
// them.
var (
	deltaRangeBytes = deltaRangeBytesDefault
	deltaFlushEvery = deltaFlushEveryDefault
)

// TestingDeltaRangeBytes sets the digest's range size (tests of other
// packages: small states of many ranges) until the returned function runs.
func TestingDeltaRangeBytes(n int) (restore func()) {
	old := deltaRangeBytes
	deltaRangeBytes = n
	return func() { deltaRangeBytes = old }
}

// ErrBadDigest: a delta request's digest does not decode.
var ErrBadDigest = errors.New("sm: bad snapshot digest")

// testingDeltaKeepAll, when set (tests only), makes a server keep every
// range, whatever the hashes: the planted bug TestDeltaCatchesWrongKeep
// proves the fetcher's state hash catches.
var testingDeltaKeepAll bool

// deltaRange is one range of a digest: [start, the next range's start).
// last is the fetcher's own last key in it (nil: none), not sent: a
// replaced range is cleared only up to it, so that the server's records
// above it (the new keys of a keyspace that grows at its end) overlap
// nothing in the staged copy and are ingested into its bottom level
// instead of level 0, to be compacted down again.
type deltaRange struct {
	start []byte
	last  []byte
	hash  uint64
}

// rangeEnd is the end of range i of rs.
func rangeEnd(rs []deltaRange, i int) []byte {
	if i+1 < len(rs) {
		return rs[i+1].start
	}
	return keyspaceEnd
}

// pebbleKey is start as a bound to give Pebble: the first range starts at
// the empty key, and Pebble mishandles an empty key as a bound. Its
// invariants build (-race) panics seeking to one, and, with a range
// deletion starting there among those it flushed, its compaction kept keys
// the deletions covered, so a key a delta deleted came back after the
// install (TestDeltaRestoreMatchesServer under -race saw it). "\x00" is
// below every key held: keys are never empty (a tenant prefix) and "\x00"
// is a prefix of any that starts with 0.
func pebbleKey(start []byte) []byte {
	if len(start) == 0 {
		return []byte{0}
	}
	return start
}

// emptyRangeHash is the hash of a range without records.
var emptyRangeHash = xxhash.New().Sum64()

// hashRecord adds one record to a range hash.
func hashRecord(h *xxhash.Digest, key, val []byte) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(key)))
	h.Write(n[:])
	h.Write(key)
	binary.BigEndian.PutUint32(n[:], uint32(len(val)))
	h.Write(n[:])
	h.Write(val)
}

// appendRangeHash adds one range's hash to a state hash.
func appendRangeHash(state *xxhash.Digest, hash uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], hash)
	state.Write(b[:])
}

// encodeDigest encodes rs (which the caller built within the limits).
func encodeDigest(rs []deltaRange) []byte {
	b := []byte{deltaDigestVersion}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(rs)))
	for _, r := range rs {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(r.start)))
		b = append(b, r.start...)
		b = binary.LittleEndian.AppendUint64(b, r.hash)
	}
	return b
}

// decodeDigest decodes and checks a digest from a peer (malformed input is
// ErrBadDigest, never a panic); the ranges do not alias b.
func decodeDigest(b []byte) ([]deltaRange, error) {
	bad := func(format string, args ...any) ([]deltaRange, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{ErrBadDigest}, args...)...)
	}
	if len(b) > DeltaDigestBytesMax {
		return bad("%d bytes, at most %d", len(b), DeltaDigestBytesMax)
	}
	if len(b) < 5 || b[0] != deltaDigestVersion {
		return bad("short or unknown version")
	}
	n := binary.LittleEndian.Uint32(b[1:])
	if n == 0 || n > deltaRangesMax || uint64(n)*deltaDigestRangeBytesMin > uint64(len(b)-5) {
		return bad("%d ranges in %d bytes", n, len(b))
	}
	rs := make([]deltaRange, 0, n)
	rest := b[5:]
	for i := range n {
		if len(rest) < 2 {
			return bad("range %d: truncated", i)
		}
		l := int(binary.LittleEndian.Uint16(rest))
		if len(rest) < 2+l+8 {
			return bad("range %d: truncated", i)
		}
		start := bytes.Clone(rest[2 : 2+l])
		if start == nil {
			start = []byte{}
		}
		switch {
		case i == 0 && l != 0:
			return bad("the first range starts at %x, not at the keyspace's start", start)
		case i > 0 && bytes.Compare(start, rs[i-1].start) <= 0:
			return bad("range %d starts at %x, not above %x", i, start, rs[i-1].start)
		case bytes.Compare(start, keyspaceEnd) >= 0:
			return bad("range %d starts past the keyspace", i)
		}
		rs = append(rs, deltaRange{start: start, hash: binary.LittleEndian.Uint64(rest[2+l:])})
		rest = rest[2+l+8:]
	}
	if len(rest) != 0 {
		return bad("%d trailing bytes", len(rest))
	}
	return rs, nil
}

// computeDigest cuts db's state (static: a staging copy nobody else
// writes) into ranges of about deltaRangeBytes and hashes each. stop is
// polled between records; it returns errStageAborted once it reports true.
func computeDigest(db *pebble.DB, stop func() bool) ([]deltaRange, error) {
	it, err := db.NewIter(&pebble.IterOptions{UpperBound: keyspaceEnd})
	if err != nil {
		return nil, fmt.Errorf("sm: digest iterator: %w", err)
	}
	defer it.Close()
	rs := []deltaRange{{start: []byte{}}}
	// held counts the encoded digest and the ranges' last keys (kept
	// here, not sent): both within DeltaDigestBytesMax, so the ranges'
	// memory is bounded as the digest is.
	held := 5 + deltaDigestRangeBytesMin
	h := xxhash.New()
	var inRange, seen int
	var last []byte // the last key hashed (keys are never empty: a tenant prefix)
	for it.First(); it.Valid(); it.Next() {
		if seen++; seen%1024 == 0 && stop() {
			return nil, errStageAborted
		}
		key := it.Key()
		if localKey(key) {
			continue
		}
		val, err := it.ValueAndErr()
		if err != nil {
			return nil, fmt.Errorf("sm: digest value: %w", err)
		}
		// A cut holds the closed range's last key and the new range's
		// start, and leaves room for the new range's own last key
		// (deltaLastKeyReserve): the last range's is held too.
		if inRange >= deltaRangeBytes && len(rs) < deltaRangesMax &&
			held+len(last)+deltaDigestRangeBytesMin+len(key)+deltaLastKeyReserve <= DeltaDigestBytesMax {
			rs[len(rs)-1].hash = h.Sum64()
			rs[len(rs)-1].last = bytes.Clone(last)
			h.Reset()
			rs = append(rs, deltaRange{start: bytes.Clone(key)})
			held += len(last) + deltaDigestRangeBytesMin + len(key)
			inRange = 0
		}
		hashRecord(h, key, val)
		inRange += len(key) + len(val)
		last = append(last[:0], key...)
	}
	if err := it.Error(); err != nil {
		return nil, fmt.Errorf("sm: digest iterator: %w", err)
	}
	rs[len(rs)-1].hash = h.Sum64()
	if len(last) == 0 {
		return rs, nil // nothing held: one range, empty
	}
	// The last range holds at least the key it was cut at, so last is
	// in it.
	rs[len(rs)-1].last = bytes.Clone(last)
	if end := append(bytes.Clone(last), 0); len(rs) < deltaRangesMax &&
		held+len(last)+deltaDigestRangeBytesMin+len(end) <= DeltaDigestBytesMax && bytes.Compare(end, keyspaceEnd) < 0 {
		rs = append(rs, deltaRange{start: end, hash: emptyRangeHash})
	}
	return rs, nil
}

// SnapshotDelta is Snapshot for a fetcher that sent digest (its staged
// copy's ranges and hashes): a delta stream of the state as of the last
// Apply, and the applied slot it reflects. A malformed digest is
// ErrBadDigest. The stream is produced while it is read and handed to the
// reader at least every deltaFlushEvery; close it when done.
func (s *SM) SnapshotDelta(digest []byte) (io.ReadCloser, uint64, error) {
	rs, err := decodeDigest(digest)
	if err != nil {
		return nil, 0, err
	}
	return s.stream(func(w io.Writer, snap *pebble.Snapshot, slot uint64) error {
		return writeDelta(w, snap, slot, rs)
	})
}

// errStopEach ends writeDelta's walk of a range early.
var errStopEach = errors.New("stop")

// writeDelta writes the delta stream of snap against the fetcher's ranges.
func writeDelta(w io.Writer, snap *pebble.Snapshot, slot uint64, rs []deltaRange) error {
	enc := newSnapEncoder(w, deltaMagic, slot)
	enc.bw.Write(binary.BigEndian.AppendUint32(nil, uint32(len(rs))))
	it, err := snap.NewIter(&pebble.IterOptions{UpperBound: keyspaceEnd})
	if err != nil {
		return fmt.Errorf("sm: delta iterator: %w", err)
	}
	defer it.Close()
	state, h := xxhash.New(), xxhash.New()
	flushed := time.Now()
	// alive hands the stream on (with a no-op when nothing else was
	// written) once deltaFlushEvery passed since it last did.
	alive := func() error {
		if time.Since(flushed) < deltaFlushEvery {
			return nil
		}
		if err := enc.marker(deltaNoop); err != nil {
			return err
		}
		flushed = time.Now()
		return enc.bw.Flush()
	}
	// each calls fn for every record of range i.
	each := func(i int, fn func(key, val []byte) error) error {
		end := rangeEnd(rs, i)
		n := 0
		for it.SeekGE(pebbleKey(rs[i].start)); it.Valid() && bytes.Compare(it.Key(), end) < 0; it.Next() {
			if localKey(it.Key()) {
				continue
			}
			v, err := it.ValueAndErr()
			if err != nil {
				return fmt.Errorf("sm: delta value: %w", err)
			}
			if err := fn(it.Key(), v); err != nil {
				return err
			}
			if n++; n%256 == 0 {
				if err := alive(); err != nil {
					return err
				}
			}
		}
		return it.Error()
	}
	for i := range rs {
		h.Reset()
		if rs[i].hash == emptyRangeHash && !testingDeltaKeepAll {
			// The fetcher holds nothing here: send whatever is here in
			// one pass, hashing it as it goes.
			empty := true
			if err := each(i, func([]byte, []byte) error { empty = false; return errStopEach }); err != nil && err != errStopEach {
				return err
			}
			if empty {
				appendRangeHash(state, emptyRangeHash)
				if err := enc.marker(deltaKeep); err != nil {
					return err
				}
				continue
			}
			if err := enc.marker(deltaReplace); err != nil {
				return err
			}
			if err := each(i, func(key, val []byte) error { hashRecord(h, key, val); return enc.record(key, val) }); err != nil {
				return err
			}
			appendRangeHash(state, h.Sum64())
			continue
		}
		if err := each(i, func(key, val []byte) error { hashRecord(h, key, val); return nil }); err != nil {
			return err
		}
		hash := h.Sum64()
		appendRangeHash(state, hash)
		if hash == rs[i].hash || testingDeltaKeepAll {
			if err := enc.marker(deltaKeep); err != nil {
				return err
			}
			if err := alive(); err != nil {
				return err
			}
			continue
		}
		if err := enc.marker(deltaReplace); err != nil {
			return err
		}
		if err := each(i, enc.record); err != nil {
			return err
		}
	}
	return enc.end(state.Sum64())
}

// readDelta reads and verifies a delta stream into db, the staged copy
// whose ranges are rs, and returns the applied slot of its header and how
// many ranges it kept.
func readDelta(db *pebble.DB, po *pebble.Options, dir string, r io.Reader, rs []deltaRange) (slot uint64, kept int, err error) {
	in := newIngester(db, po, dir)
	defer in.abort()
	sr := newStreamReader(r)
	head, err := sr.header(deltaMagic, 12)
	if err != nil {
		return 0, 0, err
	}
	slot = binary.BigEndian.Uint64(head)
	if n := binary.BigEndian.Uint32(head[8:]); n != uint32(len(rs)) {
		return 0, 0, badSnapshot("the stream has %d ranges, the digest %d", n, len(rs))
	}
	state, h := xxhash.New(), xxhash.New()
	cur, replacing := -1, false
	var prev []byte
	closeRange := func() {
		switch {
		case cur < 0:
		case replacing:
			appendRangeHash(state, h.Sum64())
		default:
			appendRangeHash(state, rs[cur].hash)
		}
	}
	for {
		kind, err := sr.kind()
		if err != nil {
			return 0, 0, err
		}
		if kind == snapEnd {
			break
		}
		switch kind {
		case deltaNoop:
		case deltaKeep, deltaReplace:
			closeRange()
			if cur++; cur >= len(rs) {
				return 0, 0, badSnapshot("more than %d ranges", len(rs))
			}
			replacing = kind == deltaReplace
			if !replacing {
				kept++
				continue
			}
			h.Reset()
			prev = prev[:0]
			if last := rs[cur].last; last != nil {
				// [start, last]: everything the staged copy holds in it.
				if err := db.DeleteRange(pebbleKey(rs[cur].start), append(bytes.Clone(last), 0), pebble.NoSync); err != nil {
					return 0, 0, fmt.Errorf("sm: delta: clearing range %d: %w", cur, err)
				}
			}
		case snapRecord:
			if !replacing {
				return 0, 0, badSnapshot("a record outside a replaced range")
			}
			key, val, err := sr.record()
			if err != nil {
				return 0, 0, err
			}
			switch {
			case bytes.Compare(key, rs[cur].start) < 0 || bytes.Compare(key, rangeEnd(rs, cur)) >= 0:
				return 0, 0, badSnapshot("key %x outside range %d", key, cur)
			case len(prev) > 0 && bytes.Compare(key, prev) <= 0:
				return 0, 0, badSnapshot("key %x after %x: out of order", key, prev)
			}
			prev = append(prev[:0], key...)
			hashRecord(h, key, val)
			if err := in.set(key, val); err != nil {
				return 0, 0, err
			}
		default:
			return 0, 0, badSnapshot("record kind %d", kind)
		}
	}
	closeRange()
	if cur != len(rs)-1 {
		return 0, 0, badSnapshot("the stream covers %d of %d ranges", cur+1, len(rs))
	}
	extra, err := sr.end(1)
	if err != nil {
		return 0, 0, err
	}
	if got := state.Sum64(); got != extra[0] {
		return 0, 0, badSnapshot("the staged state hashes to %#x, the server's to %#x", got, extra[0])
	}
	if err := in.ingest(); err != nil {
		return 0, 0, err
	}
	return slot, kept, nil
}
