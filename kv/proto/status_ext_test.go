package proto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// sampleExtendedStatus is a leader's STATUS reply with the progress
// extension: its own row in full, a follower it tracks, and a member it has
// not heard from (whose figures are unknown).
func sampleExtendedStatus() *Response {
	return &Response{Op: OpStatus, Tenant: 7, ID: 9, Cluster: &ClusterStatus{Self: 1, LeaderID: 1, LeaderAddr: "a:1",
		Ballot: Ballot{Round: 3, Node: 1}, Extended: true,
		Members: []MemberStatus{
			{ID: 1, Addr: "a:1", Role: RoleLeader, Ballot: Ballot{3, 1}, Commit: 10, Applied: 9, Reachable: true,
				Known: KnownRole | KnownCommit | KnownApplied | KnownReachable | KnownAcked | KnownHeard | KnownLag, Acked: 10},
			{ID: 2, Addr: "a:2", Role: RoleFollower, Ballot: Ballot{3, 1}, Commit: 8, Reachable: true, Acked: 10,
				Known:    KnownRole | KnownCommit | KnownReachable | KnownAcked | KnownHeard | KnownLag,
				HeardAgo: 12 * time.Millisecond, Lag: 40 * time.Millisecond},
			{ID: 3, Addr: "a:3", Known: KnownReachable | KnownHeard | KnownLag, HeardAgo: 9 * time.Second,
				Lag: 1280 * time.Millisecond, LagAtLeast: true},
		}}}
}

func TestStatusExtensionRoundTrip(t *testing.T) {
	resp := sampleExtendedStatus()
	frame := AppendResponse(nil, resp)
	got, n, err := DecodeResponseFrame(frame)
	if err != nil || n != len(frame) {
		t.Fatalf("decode: %v (%d of %d bytes)", err, n, len(frame))
	}
	if !reflect.DeepEqual(normalize(got), normalize(resp)) {
		t.Fatalf("round trip\n got %+v\nwant %+v", got.Cluster, resp.Cluster)
	}
	// The basic reply of the same status is a prefix: an old client that
	// did not ask for the extension never sees it.
	basic := *resp.Cluster
	basic.Extended = false
	b := AppendResponse(nil, &Response{Op: OpStatus, Tenant: 7, ID: 9, Cluster: &basic})
	if len(b) != len(frame)-(1+2+3*statusExtRowBytes) {
		t.Fatalf("basic reply of %d bytes, extended %d: the extension is not a suffix", len(b), len(frame))
	}
	old, _, err := DecodeResponseFrame(b)
	if err != nil || old.Cluster.Extended || old.Cluster.Members[1].Known != 0 {
		t.Fatalf("basic reply: %+v %v", old, err)
	}
}

// TestStatusExtensionMasksGuesses: a figure the row does not know goes out
// as zero, whatever the caller left in it.
func TestStatusExtensionMasksGuesses(t *testing.T) {
	resp := sampleExtendedStatus()
	m := &resp.Cluster.Members[2]
	m.Role, m.Commit, m.Applied, m.Acked = RoleFollower, 99, 98, 97
	got, _, err := DecodeResponseFrame(AppendResponse(nil, resp))
	if err != nil {
		t.Fatal(err)
	}
	g := got.Cluster.Members[2]
	if g.Role != RoleUnknown || g.Commit != 0 || g.Applied != 0 || g.Acked != 0 {
		t.Fatalf("unknown figures went out as guesses: %+v", g)
	}
}

func TestStatusRequestFormat(t *testing.T) {
	for _, f := range []uint8{0, StatusFormatBasic, StatusFormatProgress} {
		req := &Request{Op: OpStatus, Tenant: 7, ID: 3, StatusFormat: f}
		got, _, err := DecodeFrame(AppendRequest(nil, req))
		if err != nil || got.StatusFormat != f {
			t.Fatalf("format %d: %+v %v", f, got, err)
		}
	}
	for _, body := range [][]byte{{0}, {3}, {StatusFormatProgress, 0}} {
		frame := AppendHeader(nil, Header{Length: uint32(len(body)), Op: OpStatus, Tenant: 7, ID: 3})
		if _, _, err := DecodeFrame(append(frame, body...)); !errors.Is(err, ErrMalformed) {
			t.Fatalf("STATUS body %x: %v, want malformed", body, err)
		}
	}
}

// badExtensions are extended STATUS replies broken one way each.
func badExtensions() map[string][]byte {
	good := AppendResponse(nil, sampleExtendedStatus())
	basicLen := len(good) - (1 + 2 + 3*statusExtRowBytes)
	row := func(i int) int { return basicLen + 3 + i*statusExtRowBytes }
	edit := func(f func(b []byte) []byte) []byte {
		b := f(append([]byte(nil), good...))
		binary.BigEndian.PutUint32(b, uint32(len(b)-HeaderBytes))
		return b
	}
	return map[string][]byte{
		"unknown format":        edit(func(b []byte) []byte { b[basicLen] = 9; return b }),
		"rows not members":      edit(func(b []byte) []byte { binary.BigEndian.PutUint16(b[basicLen+1:], 2); return b }),
		"truncated row":         edit(func(b []byte) []byte { return b[:len(b)-5] }),
		"trailing bytes":        edit(func(b []byte) []byte { return append(b, 0) }),
		"acked while unknown":   edit(func(b []byte) []byte { b[row(2)+8] = 1; return b }),
		"commit while unknown":  edit(func(b []byte) []byte { b[row(1)] &^= byte(KnownCommit); return b }),
		"lag bound without lag": edit(func(b []byte) []byte { b[row(0)] = byte(KnownRole) | knownLagAtLeast; return b }),
		"age overflows":         edit(func(b []byte) []byte { binary.BigEndian.PutUint64(b[row(1)+9:], statusMillisMax+1); return b }),
	}
}

func TestStatusExtensionMalformed(t *testing.T) {
	for name, b := range badExtensions() {
		_, _, err := DecodeResponseFrame(b)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want malformed", name, err)
			continue
		}
		if !strings.Contains(err.Error(), "STATUS") {
			t.Errorf("%s: error %q does not name the opcode", name, err)
		}
	}
}

// TestStatusExtensionSeeds keeps the extension's seeds in the fuzz
// corpora (FuzzDecodeResponse, FuzzDecodeFrame), so every `go test` runs
// them; SYNOD_WRITE_CORPUS=1 rewrites them.
func TestStatusExtensionSeeds(t *testing.T) {
	seeds := map[string][]byte{
		"FuzzDecodeResponse/status-ext": AppendResponse(nil, sampleExtendedStatus()),
		"FuzzDecodeFrame/status-format": AppendRequest(nil, &Request{Op: OpStatus, Tenant: 7, ID: 3, StatusFormat: StatusFormatProgress}),
	}
	for name, b := range badExtensions() {
		seeds["FuzzDecodeResponse/status-ext-"+strings.ReplaceAll(name, " ", "-")] = b
	}
	for name, b := range seeds {
		path := filepath.Join("testdata", "fuzz", name)
		if os.Getenv("SYNOD_WRITE_CORPUS") == "1" {
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
