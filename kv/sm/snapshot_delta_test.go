package sm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"synod/kv/proto"
	"synod/tenants"
)

// rawState is every key and value of s's Pebble inside the keyspace (data,
// applied slot, client table): what a restore must reproduce exactly.
func rawState(t *testing.T, s *SM) map[string]string {
	t.Helper()
	it, err := s.db.NewIter(&pebble.IterOptions{UpperBound: keyspaceEnd})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	m := map[string]string{}
	for it.First(); it.Valid(); it.Next() {
		if !localKey(it.Key()) {
			m[string(it.Key())] = string(it.Value())
		}
	}
	return m
}

func sameState(t *testing.T, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d keys, want %d", len(got), len(want))
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Fatalf("key %x: %d bytes (present %v), want %d bytes", k, len(g), ok, len(v))
		}
	}
}

// deltaPair is a server and a fetcher that applied the same first
// writes, after which the server applied more (new keys at the end of the
// keyspace, updates and deletes of old keys, a new tenant).
type deltaPair struct {
	server, fetcher *SM
}

func newDeltaPair(t *testing.T, common int) *deltaPair {
	t.Helper()
	p := &deltaPair{server: openT(t, filepath.Join(t.TempDir(), "server")), fetcher: openT(t, filepath.Join(t.TempDir(), "fetcher"))}
	as, af := newApplier(t, p.server), newApplier(t, p.fetcher)
	val := func(i int) []byte { return bytes.Repeat([]byte{byte(i), byte(i >> 8)}, 50) }
	for i := range common {
		mk := func() *proto.Request {
			return &proto.Request{Op: proto.OpPut, ClientID: 7, Key: fmt.Appendf(nil, "k-%05d", i), Value: val(i)}
		}
		as.apply(tenants.ID(1+i%2), mk())
		af.apply(tenants.ID(1+i%2), mk())
	}
	for i := common; i < common+common/4; i++ {
		as.apply(1, &proto.Request{Op: proto.OpPut, ClientID: 7, Key: fmt.Appendf(nil, "k-%05d", i), Value: val(i)})
	}
	// The fetcher's checkpoint holds what it flushed (its memtables are
	// not in it): flush, as compaction snapshots do on a running node.
	if _, err := p.fetcher.Flush(); err != nil {
		t.Fatal(err)
	}
	// Writes both applied after that flush are in the fetcher's memtable
	// only, so not in its checkpoint: the delta must bring them back.
	for i := range 10 {
		as.apply(2, put(fmt.Sprintf("k-00%03d", i), "unflushed"))
		af.apply(2, put(fmt.Sprintf("k-00%03d", i), "unflushed"))
	}
	as.apply(1, put("k-00003", "updated"))
	as.apply(2, &proto.Request{Op: proto.OpDelete, Key: []byte("k-00005")})
	as.apply(3, put("tenant-3", "new"))
	return p
}

func (p *deltaPair) close() {
	p.server.Close()
	p.fetcher.Close()
}

// deltaStream stages a delta transfer from p.server into p.fetcher up to
// the stream (returned, and not yet written to the Stager).
func (p *deltaPair) deltaStream(t *testing.T) (*Stager, []byte, uint64) {
	t.Helper()
	st, err := p.fetcher.BeginDeltaStage()
	if err != nil {
		t.Fatal(err)
	}
	digest, err := st.Digest()
	if err != nil {
		t.Fatal(err)
	}
	rc, slot, err := p.server.SnapshotDelta(digest)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	stream, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return st, stream, slot
}

// install writes stream into st, finishes it at slot and installs it, and
// requires the fetcher's state to be the server's.
func (p *deltaPair) install(t *testing.T, st *Stager, stream []byte, slot uint64) {
	t.Helper()
	if _, err := st.Write(stream); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Finish(); err != nil || got != slot {
		t.Fatalf("finish: slot %d, %v; want %d", got, err, slot)
	}
	if err := p.fetcher.InstallStaged(slot); err != nil {
		t.Fatal(err)
	}
	sameState(t, rawState(t, p.fetcher), rawState(t, p.server))
	// The kept ranges came from the fetcher's own state, its installed
	// slot among them: the copy must say it was installed at slot.
	if got, _, err := p.fetcher.getRaw(installedKey); err != nil || p.fetcher.Installed() != slot || binary.BigEndian.Uint64(got) != slot {
		t.Fatalf("installed %d (key %x, %v) after a delta at slot %d", p.fetcher.Installed(), got, err, slot)
	}
}

func smallRanges(t *testing.T, bytes int) {
	t.Cleanup(TestingDeltaRangeBytes(bytes))
}

// TestDeltaRestoreMatchesServer: a delta transfer leaves the fetcher with
// exactly the server's state (every key, the applied slot, the client
// table), keeps the ranges nobody wrote since (more than half of them
// here), and sends far fewer bytes than a whole snapshot.
func TestDeltaRestoreMatchesServer(t *testing.T) {
	smallRanges(t, 2048)
	p := newDeltaPair(t, 800)
	defer p.close()
	st, stream, slot := p.deltaStream(t)
	a := newApplier(t, p.fetcher)
	a.apply(1, put("live", "applied during the staging")) // applies go on
	for off := 0; off < len(stream); off += 1000 {
		if _, err := st.Write(stream[off:min(off+1000, len(stream))]); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	got, err := st.Finish()
	if err != nil || got != slot {
		t.Fatalf("finish: slot %d, %v; want %d", got, err, slot)
	}
	kept, ranges := st.DeltaRanges()
	if err := p.fetcher.InstallStaged(slot); err != nil {
		t.Fatal(err)
	}
	sameState(t, rawState(t, p.fetcher), rawState(t, p.server))
	if p.fetcher.Applied() != p.server.Applied() {
		t.Fatalf("applied %d, want %d", p.fetcher.Applied(), p.server.Applied())
	}
	if v, ok := mustGet(t, p.fetcher, 1, "k-00003"); !ok || v != "updated" {
		t.Fatalf("an updated key in a range otherwise old: %q %v", v, ok)
	}
	if _, ok := mustGet(t, p.fetcher, 2, "k-00005"); ok {
		t.Fatal("a key the server deleted survived the delta")
	}
	rc, _, err := p.server.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	whole, _ := io.ReadAll(rc)
	rc.Close()
	t.Logf("delta: ranges=%d kept=%d delta_bytes=%d whole_bytes=%d", ranges, kept, len(stream), len(whole))
	if ranges < 20 || kept*2 < ranges || kept == ranges {
		t.Fatalf("kept %d of %d ranges: want most, not all", kept, ranges)
	}
	if len(stream)*2 > len(whole) {
		t.Fatalf("the delta is %d bytes, the whole stream %d", len(stream), len(whole))
	}
}

// TestDeltaNoopsWhileHashing: a server that hands the stream on after
// every few records (no-ops while it hashes) still produces a delta the
// fetcher restores exactly; the no-ops are there.
func TestDeltaNoopsWhileHashing(t *testing.T) {
	smallRanges(t, 64<<10)
	old := deltaFlushEvery
	deltaFlushEvery = 0
	defer func() { deltaFlushEvery = old }()
	p := newDeltaPair(t, 1200)
	defer p.close()
	st, stream, slot := p.deltaStream(t)
	if n := bytes.Count(stream, []byte{deltaNoop}); n < 4 {
		t.Fatalf("%d no-op bytes in the stream: the server wrote none", n)
	}
	p.install(t, st, stream, slot)
}

// TestDeltaCatchesWrongKeep plants a server that keeps every range
// whatever the hashes: the fetcher's state hash must refuse the staging
// (ErrBadSnapshot) and its state must be as it was.
func TestDeltaCatchesWrongKeep(t *testing.T) {
	smallRanges(t, 2048)
	p := newDeltaPair(t, 400)
	defer p.close()
	before := rawState(t, p.fetcher)
	testingDeltaKeepAll = true
	st, stream, _ := p.deltaStream(t)
	testingDeltaKeepAll = false
	_, werr := st.Write(stream)
	_, err := st.Finish()
	if !errors.Is(err, ErrBadSnapshot) {
		t.Fatalf("a server that kept changed ranges: write %v, finish %v; want ErrBadSnapshot", werr, err)
	}
	t.Logf("planted wrong keep caught: %v", err)
	sameState(t, rawState(t, p.fetcher), before)
	if p.fetcher.StagedSlot() != 0 {
		t.Fatal("a refused staging left a staged copy")
	}
	// The same pair without the plant restores.
	st, stream, slot := p.deltaStream(t)
	st.Write(stream)
	if got, err := st.Finish(); err != nil || got != slot {
		t.Fatalf("honest delta: %d, %v", got, err)
	}
}

// TestDeltaFromEmptyState: a fetcher with nothing gets one range, replaced.
func TestDeltaFromEmptyState(t *testing.T) {
	p := newDeltaPair(t, 200)
	defer p.close()
	empty := openT(t, filepath.Join(t.TempDir(), "empty"))
	defer empty.Close()
	p.fetcher = empty
	st, stream, slot := p.deltaStream(t)
	st.Write(stream)
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	if kept, ranges := st.DeltaRanges(); kept != 0 || ranges != 1 {
		t.Fatalf("kept %d of %d ranges, want 0 of 1", kept, ranges)
	}
	if err := empty.InstallStaged(slot); err != nil {
		t.Fatal(err)
	}
	sameState(t, rawState(t, empty), rawState(t, p.server))
}

// TestDeltaRejectsBadStreams: a delta stream cut short anywhere, with a
// byte changed, or well sealed but wrong in structure (a record in a kept
// range, a key outside its range or out of order, too few ranges) is
// refused, and the fetcher's state stays as it was.
func TestDeltaRejectsBadStreams(t *testing.T) {
	smallRanges(t, 4096)
	p := newDeltaPair(t, 200)
	defer p.close()
	before := rawState(t, p.fetcher)
	_, good, slot := p.deltaStream(t)
	p.fetcher.abortStaging()
	if len(good) < 200 {
		t.Fatalf("a %d-byte stream is too short for the test", len(good))
	}
	refuse := func(name string, stream []byte) {
		t.Helper()
		st, err := p.fetcher.BeginDeltaStage()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Digest(); err != nil {
			t.Fatal(err)
		}
		st.Write(stream)
		if _, err := st.Finish(); !errors.Is(err, ErrBadSnapshot) {
			t.Fatalf("%s: finish %v, want ErrBadSnapshot", name, err)
		}
	}
	for cut := 0; cut < len(good); cut += 1 + cut/8 {
		refuse(fmt.Sprintf("cut at %d", cut), good[:cut])
	}
	for _, at := range []int{0, 9, 17, 19, 20, len(good) / 2, len(good) - 1} {
		b := bytes.Clone(good)
		b[at] ^= 0x40
		refuse(fmt.Sprintf("byte %d changed", at), b)
	}
	refuse("trailing byte", append(bytes.Clone(good), 0))

	// Well-sealed streams (right count and checksum) of a wrong shape,
	// against the fetcher's own digest.
	st, err := p.fetcher.BeginDeltaStage()
	if err != nil {
		t.Fatal(err)
	}
	digest, _ := st.Digest()
	st.Abort()
	rs, err := decodeDigest(digest)
	if err != nil || len(rs) < 3 {
		t.Fatalf("digest of %d ranges: %v", len(rs), err)
	}
	seal := func(build func(e *snapEncoder)) []byte {
		var out bytes.Buffer
		e := newSnapEncoder(&out, deltaMagic, slot)
		e.bw.Write(binary.BigEndian.AppendUint32(nil, uint32(len(rs))))
		build(e)
		e.end(0)
		return out.Bytes()
	}
	allKeep := func(e *snapEncoder, from int) {
		for range rs[from:] {
			e.marker(deltaKeep)
		}
	}
	refuse("a record in a kept range", seal(func(e *snapEncoder) {
		e.marker(deltaKeep)
		e.record(rs[0].start, []byte("v"))
		allKeep(e, 1)
	}))
	refuse("a key outside its range", seal(func(e *snapEncoder) {
		e.marker(deltaReplace)
		e.record(rs[1].start, []byte("v"))
		allKeep(e, 1)
	}))
	refuse("keys out of order", seal(func(e *snapEncoder) {
		e.marker(deltaKeep)
		e.marker(deltaReplace)
		k := bytes.Clone(rs[1].start)
		e.record(append(bytes.Clone(k), 2), []byte("v"))
		e.record(append(k, 1), []byte("v"))
		allKeep(e, 2)
	}))
	refuse("too few ranges", seal(func(e *snapEncoder) { allKeep(e, 1) }))
	refuse("too many ranges", seal(func(e *snapEncoder) { allKeep(e, 0); e.marker(deltaKeep) }))
	refuse("every range kept, state hash wrong", seal(func(e *snapEncoder) { allKeep(e, 0) }))
	sameState(t, rawState(t, p.fetcher), before)
}

// TestDeltaStagingCrash: a crash (Abandon) while the digest is computed
// or halfway through the stream leaves the old state and no staging
// after a reopen, and the transfer then succeeds; a crash after Finish
// swaps the staged copy in on reopen (the rules of "Staged restores").
func TestDeltaStagingCrash(t *testing.T) {
	smallRanges(t, 2048)
	p := newDeltaPair(t, 400)
	defer func() { p.close() }()
	dir := p.fetcher.dir
	// A crash loses what was not flushed (the acceptor log replays it on a
	// real node): compare with the flushed state.
	if _, err := p.fetcher.Flush(); err != nil {
		t.Fatal(err)
	}
	before := rawState(t, p.fetcher)
	reopen := func() {
		t.Helper()
		p.fetcher = openT(t, dir)
		if _, err := os.Stat(dir + restoreDirSuffix); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a staging directory survived the reopen: %v", err)
		}
	}
	if _, err := p.fetcher.BeginDeltaStage(); err != nil {
		t.Fatal(err)
	}
	p.fetcher.Abandon()
	reopen()
	sameState(t, rawState(t, p.fetcher), before)

	st, stream, slot := p.deltaStream(t)
	st.Write(stream[:len(stream)/2])
	p.fetcher.Abandon()
	reopen()
	sameState(t, rawState(t, p.fetcher), before)

	st, stream, slot = p.deltaStream(t)
	st.Write(stream)
	if _, err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	p.fetcher.Abandon()
	reopen()
	if p.fetcher.Applied() != slot {
		t.Fatalf("applied %d after the reopen, want the staged %d", p.fetcher.Applied(), slot)
	}
	sameState(t, rawState(t, p.fetcher), rawState(t, p.server))
}

// TestDigestWithinLimits: a state of more keys than deltaRangesMax, cut at
// every key, gives a digest within deltaRangesMax ranges and
// DeltaDigestBytesMax bytes, with the fetcher's own last keys within the
// same bytes (the last range runs to the end), and the delta still
// restores.
func TestDigestWithinLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("applies 20,000 writes")
	}
	smallRanges(t, 1)
	p := newDeltaPair(t, deltaRangesMax+3000)
	defer p.close()
	st, stream, slot := p.deltaStream(t)
	digest, _ := st.Digest()
	rs, err := decodeDigest(digest)
	if err != nil {
		t.Fatal(err)
	}
	// The last keys the fetcher holds count against the same bytes: here
	// the byte bound is reached before the range count. (Of the staged
	// checkpoint the digest describes: the live state also holds what
	// the fetcher's memtables hold, and a different state may cut at a
	// different key.)
	own, err := computeDigest(st.db, func() bool { return false })
	if err != nil || len(own) != len(rs) {
		t.Fatalf("the fetcher's own ranges: %d (digest %d), %v", len(own), len(rs), err)
	}
	held := 5
	for _, r := range own {
		held += deltaDigestRangeBytesMin + len(r.start) + len(r.last)
	}
	// Reached: no room for one more cut of two short keys besides the
	// reserve for the last range's last key.
	reached := len(rs) == deltaRangesMax || held+2*(deltaDigestRangeBytesMin+64)+deltaLastKeyReserve > DeltaDigestBytesMax
	if len(rs) > deltaRangesMax || len(digest) > DeltaDigestBytesMax || held > DeltaDigestBytesMax || !reached {
		t.Fatalf("digest of %d ranges in %d bytes (%d bytes held with the last keys): want a limit reached, none passed (%d ranges, %d bytes)",
			len(rs), len(digest), held, deltaRangesMax, DeltaDigestBytesMax)
	}
	t.Logf("digest: ranges=%d bytes=%d keys_held=%d", len(rs), len(digest), held)
	p.install(t, st, stream, slot)
}

// TestDecodeDigestRejects: a server refuses every malformed digest with
// ErrBadDigest.
func TestDecodeDigestRejects(t *testing.T) {
	rng := func(start string, h uint64) deltaRange { return deltaRange{start: []byte(start), hash: h} }
	good := encodeDigest([]deltaRange{rng("", 1), rng("b", 2), rng("c", 3)})
	if rs, err := decodeDigest(good); err != nil || len(rs) != 3 || string(rs[2].start) != "c" || rs[2].hash != 3 {
		t.Fatalf("good digest: %v %v", rs, err)
	}
	cases := map[string][]byte{
		"empty":              nil,
		"unknown version":    append([]byte{9}, good[1:]...),
		"no ranges":          encodeDigest(nil),
		"first not empty":    encodeDigest([]deltaRange{rng("a", 1)}),
		"not increasing":     encodeDigest([]deltaRange{rng("", 1), rng("c", 2), rng("b", 3)}),
		"repeated start":     encodeDigest([]deltaRange{rng("", 1), rng("b", 2), rng("b", 3)}),
		"past the keyspace":  encodeDigest([]deltaRange{rng("", 1), {start: keyspaceEnd}}),
		"count too large":    append(append([]byte{1}, binary.LittleEndian.AppendUint32(nil, 1<<30)...), good[5:]...),
		"trailing byte":      append(bytes.Clone(good), 0),
		"truncated":          good[:len(good)-1],
		"too large":          make([]byte, DeltaDigestBytesMax+1),
		"key length too far": append(append([]byte{1, 1, 0, 0, 0}, 0xff, 0xff), make([]byte, 20)...),
	}
	for name, b := range cases {
		if _, err := decodeDigest(b); !errors.Is(err, ErrBadDigest) {
			t.Errorf("%s: %v, want ErrBadDigest", name, err)
		}
	}
	s := openT(t, t.TempDir())
	defer s.Close()
	if _, _, err := s.SnapshotDelta(cases["not increasing"]); !errors.Is(err, ErrBadDigest) {
		t.Fatalf("SnapshotDelta of a bad digest: %v", err)
	}
}

// FuzzDecodeDigest: no input panics, and what decodes re-encodes to itself.
func FuzzDecodeDigest(f *testing.F) {
	f.Add(encodeDigest([]deltaRange{{start: []byte{}, hash: 1}, {start: []byte("k"), hash: 2}}))
	f.Add([]byte{1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		rs, err := decodeDigest(b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeDigest(rs), b) {
			t.Fatalf("%x decodes to %d ranges that encode differently", b, len(rs))
		}
	})
}
