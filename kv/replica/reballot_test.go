package replica

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"synod/paxos"
	"synod/pmem"
)

// TestPMemLogReballot: a re-ballot record gives the value of the record
// it names a new ballot across a recovery, takes a ring record of
// reballotRingBytes instead of the value again, and a re-ballot whose
// named record the log lacks fails recovery with an error that says so.
// A binary that predates re-ballots fails to decode one (it does not skip
// it and forget the ballot).
func TestPMemLogReballot(t *testing.T) {
	open := func(path string) *PMemLog {
		l, _, err := OpenPMemLog(pmem.Options{Path: path, SizeBytes: minLogBytes, Mode: pmem.ModeMsync, ClusterID: 9, NodeID: 1})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	val := bytes.Repeat([]byte("v"), 64<<10)
	b1, b2 := paxos.Ballot{Round: 1, Node: 1}, paxos.Ballot{Round: 2, Node: 2}
	path := filepath.Join(t.TempDir(), "log")
	l := open(path)
	full := paxos.Entry{Slot: 7, Ballot: b1, Type: paxos.EntryNormal, Cmds: [][]byte{val}}
	if err := l.Append([]paxos.Entry{full}); err != nil {
		t.Fatal(err)
	}
	used0, _ := l.Usage()
	rb := full
	rb.Ballot, rb.Held = b2, b1
	if err := l.Append([]paxos.Entry{rb}); err != nil {
		t.Fatal(err)
	}
	if err := l.Persist(); err != nil {
		t.Fatal(err)
	}
	used1, _ := l.Usage()
	if used1-used0 != reballotRingBytes || reballotRingBytes > 128 {
		t.Fatalf("the re-ballot took %d ring bytes, want reballotRingBytes (%d, at most 128)", used1-used0, reballotRingBytes)
	}
	l.Close()
	l = open(path)
	_, es, err := l.Recover(0)
	if err != nil || len(es) != 1 || es[0].Ballot != b2 || !es[0].Held.IsZero() || len(es[0].Cmds) != 1 || !bytes.Equal(es[0].Cmds[0], val) {
		t.Fatalf("recovered %d entries (%v): want slot 7's value under %v", len(es), err, b2)
	}
	// A re-ballot older than the slot's last record changes nothing (the
	// accel fast path may record a later ballot first).
	b3 := paxos.Ballot{Round: 3, Node: 3}
	s9 := full
	s9.Slot = 9
	s9b3 := s9
	s9b3.Ballot = b3
	s9rb := s9
	s9rb.Ballot, s9rb.Held = b2, b1
	if err := l.Append([]paxos.Entry{s9, s9b3, s9rb}); err != nil {
		t.Fatal(err)
	}
	if err := l.Persist(); err != nil {
		t.Fatal(err)
	}
	if _, es, err := l.Recover(0); err != nil || len(es) != 2 || es[1].Slot != 9 || es[1].Ballot != b3 {
		t.Fatalf("a stale re-ballot: recovered %+v, %v; want slot 9 under %v", es, err, b3)
	}
	// A re-ballot naming a ballot the log does not hold for the slot.
	bad := full
	bad.Slot, bad.Ballot, bad.Held = 8, b2, b1
	if err := l.Append([]paxos.Entry{bad}); err != nil {
		t.Fatal(err)
	}
	if err := l.Persist(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Recover(0); err == nil || !strings.Contains(err.Error(), "re-ballot of slot 8") {
		t.Fatalf("recovering a re-ballot without its record: %v, want an error naming it", err)
	}
	l.Close()
	if _, err := paxos.UnmarshalEntry(entryPayload(&rb)); err == nil {
		t.Fatal("an entry decoder (a binary before re-ballots) decodes a re-ballot payload")
	}
}

// FuzzDecodeReballot: any bytes decode without a panic; a payload that
// decodes re-encodes to itself.
func FuzzDecodeReballot(f *testing.F) {
	f.Add(entryPayload(&paxos.Entry{Slot: 3, Ballot: paxos.Ballot{Round: 2, Node: 1}, Type: paxos.EntryNormal, Held: paxos.Ballot{Round: 1, Node: 3}}))
	f.Add(paxos.AppendEntry(nil, &paxos.Entry{Slot: 3, Ballot: paxos.Ballot{Round: 2, Node: 1}, Type: paxos.EntryNoop}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, ok := decodeReballot(b)
		if !ok {
			return
		}
		if got := entryPayload(&e); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x, decoded from %x", got, b)
		}
	})
}
