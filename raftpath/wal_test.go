package raftpath

import (
	"os"
	"path/filepath"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func ent(i, term uint64, data string) *pb.Entry {
	return &pb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(term), Data: []byte(data)}
}

func hs(term, vote, commit uint64) *pb.HardState {
	return &pb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(vote), Commit: proto.Uint64(commit)}
}

func TestWALRoundTripAndOverwrite(t *testing.T) {
	dir := t.TempDir()
	w, rec, err := OpenWAL(dir)
	if err != nil || rec.Snapshot != nil || len(rec.Entries) != 0 {
		t.Fatalf("fresh wal: %+v %v", rec, err)
	}
	must(t, w.Save(hs(1, 1, 0), []*pb.Entry{ent(1, 1, "a"), ent(2, 1, "b"), ent(3, 1, "c")}, true))
	// A new leader overwrites the uncommitted suffix from index 2.
	must(t, w.Save(hs(2, 2, 1), []*pb.Entry{ent(2, 2, "B"), ent(3, 2, "C"), ent(4, 2, "D")}, true))
	must(t, w.Close())
	_, rec, err = OpenWAL(dir)
	must(t, err)
	if got := entryString(rec.Entries); got != "1:1:a 2:2:B 3:2:C 4:2:D" {
		t.Fatalf("entries %s", got)
	}
	if rec.HardState.GetTerm() != 2 || rec.HardState.GetCommit() != 1 {
		t.Fatalf("hard state %v", rec.HardState)
	}
}

func entryString(es []*pb.Entry) string {
	s := ""
	for i, e := range es {
		if i > 0 {
			s += " "
		}
		s += string(rune('0'+e.GetIndex())) + ":" + string(rune('0'+e.GetTerm())) + ":" + string(e.GetData())
	}
	return s
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestWALCutsTornTail truncates and corrupts the last record: recovery
// keeps the verified prefix and cuts the rest.
func TestWALCutsTornTail(t *testing.T) {
	for _, tc := range []struct {
		name string
		harm func(path string, size int64)
	}{
		{"truncated", func(p string, size int64) { os.Truncate(p, size-3) }},
		{"bitflip", func(p string, size int64) {
			b, _ := os.ReadFile(p)
			b[len(b)-2] ^= 0x40
			os.WriteFile(p, b, 0o640)
		}},
		{"zeroed", func(p string, size int64) {
			f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			f.Write(make([]byte, 64))
			f.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			w, _, err := OpenWAL(dir)
			must(t, err)
			must(t, w.Save(nil, []*pb.Entry{ent(1, 1, "a"), ent(2, 1, "b")}, true))
			must(t, w.Save(nil, []*pb.Entry{ent(3, 1, "torn")}, true))
			must(t, w.Close())
			segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
			st, _ := os.Stat(segs[0])
			tc.harm(segs[0], st.Size())
			w, rec, err := OpenWAL(dir)
			must(t, err)
			want, wantCut := "1:1:a 2:1:b", true
			if tc.name == "zeroed" {
				// Zeros past the log are preallocated space, not damage.
				want, wantCut = "1:1:a 2:1:b 3:1:torn", false
			}
			if got := entryString(rec.Entries); got != want || (rec.CutBytes > 0) != wantCut {
				t.Fatalf("entries %s cut %d, want %s (cut: %v)", got, rec.CutBytes, want, wantCut)
			}
			// Appends after the cut (or the end of the log, inside the
			// preallocated space) are readable.
			must(t, w.Save(nil, []*pb.Entry{ent(3, 2, "x")}, true))
			must(t, w.Close())
			_, rec, err = OpenWAL(dir)
			must(t, err)
			if got := entryString(rec.Entries); got != "1:1:a 2:1:b 3:2:x" {
				t.Fatalf("after reopen %s", got)
			}
		})
	}
}

// TestWALSnapshotDropsSegments fills several segments and checks a
// snapshot removes the covered ones while recovery still works.
func TestWALSnapshotDropsSegments(t *testing.T) {
	dir := t.TempDir()
	w, _, err := OpenWAL(dir)
	must(t, err)
	big := string(make([]byte, 1<<20))
	var i uint64
	for i = 1; w.Segments() < 3; i++ {
		must(t, w.Save(hs(1, 1, i), []*pb.Entry{ent(i, 1, big)}, false))
	}
	last := i - 1
	// The entry that filled segment 2 is not covered: segment 2 stays.
	must(t, w.SaveSnapshot(&pb.SnapshotMetadata{Index: proto.Uint64(last - 1), Term: proto.Uint64(1)}))
	if w.Segments() != 2 {
		t.Fatalf("%d segments after a snapshot covering all but the last entry, want 2", w.Segments())
	}
	must(t, w.Close())
	_, rec, err := OpenWAL(dir)
	must(t, err)
	if rec.Snapshot.GetIndex() != last-1 || len(rec.Entries) != 1 || rec.Entries[0].GetIndex() != last {
		t.Fatalf("recovered snapshot %d, %d entries", rec.Snapshot.GetIndex(), len(rec.Entries))
	}
}

// TestWALCorruptMiddleSegmentIsAnError: damage outside the tail is not a
// crash artefact and must not be silently cut.
func TestWALCorruptMiddleSegmentIsAnError(t *testing.T) {
	dir := t.TempDir()
	w, _, err := OpenWAL(dir)
	must(t, err)
	must(t, w.Save(nil, []*pb.Entry{ent(1, 1, "a")}, true))
	must(t, w.newSegment(2))
	must(t, w.Save(nil, []*pb.Entry{ent(2, 1, "b")}, true))
	must(t, w.Close())
	p := filepath.Join(dir, "0000000000000001.wal")
	b, _ := os.ReadFile(p)
	b[len(b)-1] ^= 1
	os.WriteFile(p, b, 0o640)
	if _, _, err := OpenWAL(dir); err == nil {
		t.Fatal("a corrupt non-final segment was accepted")
	}
}

// FuzzWALRecover feeds arbitrary bytes as the only segment: recovery must
// return an error or a consistent log, never panic.
func FuzzWALRecover(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 1, 0})
	dir := f.TempDir()
	w, _, _ := OpenWAL(filepath.Join(dir, "seed"))
	w.Save(hs(1, 1, 1), []*pb.Entry{ent(1, 1, "a"), ent(2, 1, "b")}, true)
	w.Close()
	seed, _ := os.ReadFile(filepath.Join(dir, "seed", "0000000000000001.wal"))
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		d := t.TempDir()
		os.WriteFile(filepath.Join(d, "0000000000000001.wal"), b, 0o640)
		w, rec, err := OpenWAL(d)
		if err != nil {
			return
		}
		defer w.Close()
		for i := 1; i < len(rec.Entries); i++ {
			if rec.Entries[i].GetIndex() != rec.Entries[i-1].GetIndex()+1 {
				t.Fatalf("recovered entries not contiguous")
			}
		}
	})
}

// TestWALPreallocatedAppendsReopen reopens a WAL that was not closed
// (still preallocated, zeros after the log) several times: each reopen
// must append where the log ends, not at the end of the file.
func TestWALPreallocatedAppendsReopen(t *testing.T) {
	dir := t.TempDir()
	for round := uint64(1); round <= 3; round++ {
		w, rec, err := OpenWAL(dir)
		must(t, err)
		if uint64(len(rec.Entries)) != round-1 {
			t.Fatalf("round %d: recovered %d entries", round, len(rec.Entries))
		}
		must(t, w.Save(hs(1, 1, round), []*pb.Entry{ent(round, 1, "x")}, true))
		// Simulate a crash: no Close, so no trim.
		must(t, w.f.Close())
		segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
		if st, _ := os.Stat(segs[0]); st.Size() < walSegmentBytesMax {
			t.Logf("segment not preallocated (%d bytes): filesystem without fallocate", st.Size())
		}
	}
	_, rec, err := OpenWAL(dir)
	must(t, err)
	if got := entryString(rec.Entries); got != "1:1:x 2:1:x 3:1:x" {
		t.Fatalf("entries %s", got)
	}
}

// TestWALCommitNotBelowSnapshot: a snapshot record received from the
// leader is synced, the hard state raising the commit to it is not (raft
// asks no sync for a commit change); after a power loss that kept only
// the first, recovery must not hand raft a commit below the snapshot
// (raft.RestartNode panics on it). TestWALPowerLoss found this.
func TestWALCommitNotBelowSnapshot(t *testing.T) {
	dir := t.TempDir()
	w, _, err := OpenWAL(dir)
	must(t, err)
	must(t, w.Save(hs(1, 1, 2), []*pb.Entry{ent(1, 1, "a"), ent(2, 1, "b")}, true))
	// The power loss ate the hard state that followed this record.
	must(t, w.SaveSnapshot(&pb.SnapshotMetadata{Index: proto.Uint64(9), Term: proto.Uint64(1)}))
	must(t, w.Close())
	_, rec, err := OpenWAL(dir)
	must(t, err)
	if rec.Snapshot.GetIndex() != 9 || rec.HardState.GetCommit() != 9 || len(rec.Entries) != 0 {
		t.Fatalf("recovered snapshot %d, commit %d, %d entries; want 9, 9, 0", rec.Snapshot.GetIndex(), rec.HardState.GetCommit(), len(rec.Entries))
	}
}
