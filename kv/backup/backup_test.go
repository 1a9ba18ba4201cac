package backup

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"synod/kv/proto"
	"synod/kv/sm"
)

// sampleStream is a real state-machine snapshot stream with a few keys.
func sampleStream(t testing.TB) ([]byte, uint64) {
	t.Helper()
	s, err := sm.Open(t.TempDir(), sm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := uint64(1); i <= 3; i++ {
		req := &proto.Request{Op: proto.OpPut, ClientID: 5, Seq: i, FirstUnacked: i, Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")}
		if _, err := s.Apply(i, [][]byte{sm.EncodeCommand(1, req)}); err != nil {
			t.Fatal(err)
		}
	}
	rc, slot, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b, slot
}

var sampleCreated = time.Date(2026, 12, 1, 10, 30, 0, 123e6, time.UTC)

func sampleFile(t testing.TB) ([]byte, Header) {
	t.Helper()
	stream, slot := sampleStream(t)
	h := Header{ClusterID: 11, Slot: slot, Created: sampleCreated, Members: []uint64{1, 2, 3}}
	var buf bytes.Buffer
	n, err := Write(&buf, h, bytes.NewReader(stream))
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("write: %d of %d bytes, %v", n, buf.Len(), err)
	}
	return buf.Bytes(), h
}

func verify(b []byte) (*Info, error) { return Verify(bytes.NewReader(b), int64(len(b))) }

func TestRoundTrip(t *testing.T) {
	b, h := sampleFile(t)
	info, err := verify(b)
	if err != nil {
		t.Fatal(err)
	}
	if info.ClusterID != 11 || info.Slot != h.Slot || !info.Created.Equal(sampleCreated) || info.MembersFormat != MembersFormatIDs ||
		fmt.Sprint(info.Members) != "[1 2 3]" || info.Version != FormatVersion || info.FileBytes != int64(len(b)) {
		t.Fatalf("info %+v", info)
	}
	if info.Snapshot.Slot != h.Slot || info.Snapshot.DataKeys != 3 || info.Snapshot.Clients != 1 {
		t.Fatalf("snapshot info %+v", info.Snapshot)
	}
	// The stream section restores into a fresh state machine.
	s, err := sm.Open(t.TempDir(), sm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Restore(info.Stream(bytes.NewReader(b))); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := s.Get(1, []byte("k2")); err != nil || !ok || string(v) != "v" || s.Applied() != h.Slot {
		t.Fatalf("restored k2 = %q %v %v, applied %d", v, ok, err, s.Applied())
	}
}

func wantErr(t *testing.T, name string, err, kind error, text string) {
	t.Helper()
	if !errors.Is(err, ErrBadBackup) || !errors.Is(err, kind) {
		t.Errorf("%s: %v, want %v", name, err, kind)
		return
	}
	if text != "" && !strings.Contains(err.Error(), text) {
		t.Errorf("%s: %q does not say %q", name, err, text)
	}
}

// reseal recomputes the trailer's checksum, so that only the check under
// test can catch an edit.
func reseal(b []byte) []byte {
	b = append([]byte(nil), b...)
	sum := sha256.Sum256(b[:len(b)-sha256.Size])
	copy(b[len(b)-sha256.Size:], sum[:])
	return b
}

func TestRefusesDamage(t *testing.T) {
	good, _ := sampleFile(t)
	edit := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	streamAt := prefixBytes + int(binary.BigEndian.Uint32(good[10:]))
	cases := []struct {
		name string
		b    []byte
		kind error
		text string
	}{
		{"bad magic", edit(func(b []byte) { copy(b, "SQLite f") }), ErrNotBackup, "magic"},
		{"empty", nil, ErrTruncated, "shorter than the smallest backup"},
		{"magic only", good[:5], ErrTruncated, ""},
		{"newer version", edit(func(b []byte) { b[9] = 2 }), ErrVersion, "format version 2"},
		{"truncated in the stream", good[:len(good)-TrailerBytes-3], ErrTruncated, "does not end with the backup trailer"},
		{"truncated in the trailer", good[:len(good)-10], ErrTruncated, "trailer"},
		{"truncated in the header", good[:prefixBytes+10], ErrTruncated, ""},
		{"bit flip in the stream", edit(func(b []byte) { b[streamAt+30] ^= 0x04 }), ErrChecksum, "damaged"},
		{"bit flip in the header", edit(func(b []byte) { b[prefixBytes+9] ^= 0x80 }), ErrChecksum, ""},
		{"bit flip in the stream length", edit(func(b []byte) { b[len(b)-sha256.Size-1] ^= 1 }), ErrChecksum, ""},
		{"wrong checksum", edit(func(b []byte) { b[len(b)-1] ^= 0xff }), ErrChecksum, "SHA-256"},
		{"trailing garbage", append(append([]byte(nil), good...), 0), ErrTruncated, ""},
		{"huge header length", edit(func(b []byte) { binary.BigEndian.PutUint32(b[10:], 1<<30) }), ErrMalformed, "exceeds"},
		// Sealed with a valid checksum: only a buggy writer makes these.
		{"sealed: unknown members format", reseal(edit(func(b []byte) { b[prefixBytes+24] = 2 })), ErrMalformed, "members format 2"},
		{"sealed: no members", reseal(edit(func(b []byte) { binary.BigEndian.PutUint16(b[prefixBytes+25:], 0) })), ErrMalformed, ""},
		{"sealed: member 0", reseal(edit(func(b []byte) { binary.BigEndian.PutUint64(b[prefixBytes+27:], 0) })), ErrMalformed, "ascending"},
		{"sealed: stream length", reseal(edit(func(b []byte) { b[len(b)-sha256.Size-1] ^= 1 })), ErrMalformed, "counts"},
		{"sealed: slot mismatch", reseal(edit(func(b []byte) { b[prefixBytes+15] ^= 1 })), ErrMalformed, "slot"},
		{"sealed: bad stream", reseal(edit(func(b []byte) { b[streamAt+30] ^= 0x04 })), ErrMalformed, "snapshot stream"},
	}
	for _, tc := range cases {
		_, err := verify(tc.b)
		wantErr(t, tc.name, err, tc.kind, tc.text)
	}
}

// TestEveryByteFlipRefused flips each bit of a small file in turn: every
// damaged copy is refused, and none of them panics.
func TestEveryByteFlipRefused(t *testing.T) {
	good, _ := sampleFile(t)
	for i := range good {
		for _, bit := range []byte{0x01, 0x80} {
			b := append([]byte(nil), good...)
			b[i] ^= bit
			if _, err := verify(b); !errors.Is(err, ErrBadBackup) {
				t.Fatalf("byte %d bit %#x flipped: %v", i, bit, err)
			}
		}
	}
	for n := 0; n < len(good); n++ {
		if _, err := verify(good[:n]); !errors.Is(err, ErrBadBackup) {
			t.Fatalf("cut to %d of %d bytes: %v", n, len(good), err)
		}
	}
}

func TestWriteRefusesBadHeader(t *testing.T) {
	stream, slot := sampleStream(t)
	for name, h := range map[string]Header{
		"no members":   {Slot: slot, Created: sampleCreated},
		"unsorted":     {Slot: slot, Created: sampleCreated, Members: []uint64{2, 1}},
		"member 0":     {Slot: slot, Created: sampleCreated, Members: []uint64{0}},
		"before 1970":  {Slot: slot, Created: time.Unix(-5, 0), Members: []uint64{1}},
		"other format": {Slot: slot, Created: sampleCreated, Members: []uint64{1}, MembersFormat: 7},
	} {
		if _, err := Write(io.Discard, h, bytes.NewReader(stream)); err == nil {
			t.Errorf("%s: written", name)
		}
	}
}

// TestStreamFailureLeavesNoTrailer: a snapshot stream that fails mid-way
// leaves a file Verify refuses as truncated.
func TestStreamFailureLeavesNoTrailer(t *testing.T) {
	stream, slot := sampleStream(t)
	var buf bytes.Buffer
	broken := io.MultiReader(bytes.NewReader(stream[:len(stream)/2]), iotestErrReader{})
	if _, err := Write(&buf, Header{Slot: slot, Created: sampleCreated, Members: []uint64{1}}, broken); err == nil {
		t.Fatal("no error from a failing stream")
	}
	_, err := verify(buf.Bytes())
	wantErr(t, "failed stream", err, ErrTruncated, "")
}

type iotestErrReader struct{}

func (iotestErrReader) Read([]byte) (int, error) { return 0, errors.New("snapshot aborted") }

// FuzzVerify: no input panics Verify, and whatever it accepts is
// consistent (its parts add up to the file).
func FuzzVerify(f *testing.F) {
	good, _ := sampleFile(f)
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := verify(b)
		if err != nil {
			if !errors.Is(err, ErrBadBackup) {
				t.Fatalf("error %v does not wrap ErrBadBackup", err)
			}
			return
		}
		if info.StreamOffset+info.StreamBytes+TrailerBytes != int64(len(b)) || info.Snapshot.Slot != info.Slot {
			t.Fatalf("accepted an inconsistent file: %+v", info)
		}
	})
}

// TestSeedCorpus keeps FuzzVerify's seeds (a good file, and damaged ones)
// under testdata/fuzz, so every `go test` runs them; SYNOD_WRITE_CORPUS=1
// rewrites them.
func TestSeedCorpus(t *testing.T) {
	good, _ := sampleFile(t)
	flip := append([]byte(nil), good...)
	flip[len(flip)/2] ^= 0x10
	seeds := map[string][]byte{
		"good":           good,
		"truncated":      good[:len(good)/2],
		"bit-flip":       flip,
		"sealed-garbage": reseal(append(append([]byte(nil), good[:prefixBytes+headerBodyBytesMin+8]...), make([]byte, TrailerBytes+3)...)),
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzVerify")
	for name, b := range seeds {
		path := filepath.Join(dir, name)
		if os.Getenv("SYNOD_WRITE_CORPUS") == "1" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("seed %s missing (run with SYNOD_WRITE_CORPUS=1): %v", path, err)
		}
	}
}
