package paxos

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
)

func sampleMessages() []Message {
	b := Ballot{Round: 3, Node: 2}
	return []Message{
		{Type: MsgPreCheck, Cluster: 7, From: 2, To: 1, Context: 5, Commit: 9},
		{Type: MsgPrepare, Cluster: 7, From: 2, To: 1, Ballot: b, Slot: 4, Commit: 3},
		{Type: MsgPromise, Cluster: 7, From: 1, To: 2, Ballot: b, Slot: 4, Index: 5, Last: 9, Commit: 3,
			Entries: []Entry{{Slot: 4, Ballot: Ballot{Round: 2, Node: 3}, Type: EntryNormal, Cmds: [][]byte{[]byte("x"), {}}},
				{Slot: 5, Ballot: Ballot{Round: 1, Node: 1}, Type: EntryNoop}}},
		{Type: MsgAccept, Cluster: 7, From: 2, To: 1, Ballot: b, Commit: 3,
			Entries: []Entry{{Slot: 4, Ballot: b, Type: EntryConfChange, Cmds: [][]byte{EncodeConfChange(ConfChange{Type: ConfAddNode, Node: 4})}}}},
		{Type: MsgAccepted, Cluster: 7, From: 1, To: 2, Ballot: b, Slot: 4, Index: 4, Commit: 3},
		{Type: MsgHeartbeatResp, Cluster: 7, From: 1, To: 2, Ballot: Ballot{Round: 9, Node: 3}, Reject: true, Context: 2},
		{Type: MsgSnapshot, Cluster: 7, From: 2, To: 1, Ballot: b, Commit: 8,
			Snapshot: &SnapshotMeta{Slot: 8, Members: []NodeID{1, 2, 3}}},
		{Type: MsgSnapshot, Cluster: 7, From: 2, To: 1, Ballot: b, Commit: 9,
			Snapshot: &SnapshotMeta{Slot: 9, Members: []NodeID{1, 2, 3}, Learners: []NodeID{4}}},
		{Type: MsgHeartbeatResp, Cluster: 7, From: 4, To: 2, Ballot: b, Context: 3, Joining: true},
		{Type: MsgTransfer, Cluster: 7, From: 2, To: 1, Ballot: b, Context: 1},
		{Type: MsgAccept, Cluster: 7, From: 2, To: 1, Ballot: b, Commit: 4,
			Entries: []Entry{{Slot: 5, Ballot: b, Type: EntryConfChange, Cmds: [][]byte{EncodeConfChange(ConfChange{Type: ConfAddLearner, Node: 4, Context: []byte("ctx")})}}}},
	}
}

func TestMessageRoundTrip(t *testing.T) {
	for _, m := range sampleMessages() {
		b := AppendMessage([]byte{0xff}, &m)[1:]
		if n := MessageSize(&m); n != len(b) {
			t.Fatalf("%v: MessageSize %d, encoding %d bytes", m.Type, n, len(b))
		}
		for i := range m.Entries {
			if n, enc := EntrySize(&m.Entries[i]), len(AppendEntry(nil, &m.Entries[i])); n != enc {
				t.Fatalf("%v: EntrySize %d, encoding %d bytes", m.Type, n, enc)
			}
		}
		if m.Snapshot == nil {
			// Head and entries encoded apart are the message.
			head := AppendMessageHead(nil, &m)
			if len(head) != MessageHeadBytes || EntriesSize(m.Entries) != len(b)-len(head) ||
				string(append(head, AppendEntries(nil, m.Entries)...)) != string(b) {
				t.Fatalf("%v: head (%d bytes) and entries (%d bytes) differ from the message (%d bytes)",
					m.Type, len(head), EntriesSize(m.Entries), len(b))
			}
		}
		got, err := UnmarshalMessage(b)
		if err != nil {
			t.Fatalf("%v: %v", m.Type, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip of %v:\n got %+v\nwant %+v", m.Type, got, m)
		}
		// Every strict prefix is an error, never a panic.
		for i := range b {
			if _, err := UnmarshalMessage(b[:i]); err == nil {
				t.Fatalf("%v: prefix of %d/%d bytes decoded", m.Type, i, len(b))
			}
		}
		if _, err := UnmarshalMessage(append(b, 0)); err == nil {
			t.Fatalf("%v: trailing byte accepted", m.Type)
		}
	}
}

func TestUnmarshalRejectsHostileCounts(t *testing.T) {
	m := Message{Type: MsgAccept, Cluster: 7, From: 2, To: 1}
	b := AppendMessage(nil, &m)
	// Claim 2^32-1 entries.
	b[len(b)-4], b[len(b)-3], b[len(b)-2], b[len(b)-1] = 0xff, 0xff, 0xff, 0xff
	if _, err := UnmarshalMessage(b); !errors.Is(err, errDecode) {
		t.Fatalf("huge entry count: %v", err)
	}
	b[0] = 9
	if _, err := UnmarshalMessage(b); err == nil {
		t.Fatal("bad version accepted")
	}
}

func TestEntryAndConfChangeRoundTrip(t *testing.T) {
	e := Entry{Slot: 9, Ballot: Ballot{Round: 1, Node: 2}, Type: EntryNormal, Cmds: [][]byte{[]byte("a"), []byte("bc")}}
	got, err := UnmarshalEntry(AppendEntry(nil, &e))
	if err != nil || !reflect.DeepEqual(got, e) {
		t.Fatalf("entry round trip: %+v, %v", got, err)
	}
	cc := ConfChange{Type: ConfRemoveNode, Node: 5}
	if got, err := DecodeConfChange(EncodeConfChange(cc)); err != nil || !reflect.DeepEqual(got, cc) {
		t.Fatalf("conf change round trip: %+v, %v", got, err)
	}
	if _, err := DecodeConfChange([]byte{1, 3, 0, 0, 0, 0, 0, 0, 0, 1}); err == nil {
		t.Fatal("bad conf change type accepted")
	}
}

// TestUnmarshalEntryDoesNotAlias holds UnmarshalEntry's contract: the
// entry shares no bytes with its input (the acceptor log's recovery
// decodes straight from the mapped region), and its commands, which share
// one copy, are capped: appending to one never writes over the next.
func TestUnmarshalEntryDoesNotAlias(t *testing.T) {
	want := Entry{Slot: 9, Ballot: Ballot{Round: 2, Node: 1}, Type: EntryNormal,
		Cmds: [][]byte{[]byte("first"), {}, []byte("third command")}}
	b := AppendEntry(nil, &want)
	e, err := UnmarshalEntry(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] ^= 0xff
	}
	if !reflect.DeepEqual(e, want) {
		t.Fatalf("after the input changed: %+v, want %+v", e, want)
	}
	_ = append(e.Cmds[0], "XXXXXXXXXXXXXXXXXXXX"...)
	_ = append(e.Cmds[1], "YYYY"...)
	if !reflect.DeepEqual(e, want) {
		t.Fatalf("after appending to the commands: %+v, want %+v", e, want)
	}
}

// TestWriteFuzzCorpus regenerates the seed corpus when -rewrite is given.
func TestWriteFuzzCorpus(t *testing.T) {
	if !rewriting() {
		t.Skip("corpus is rewritten only with -rewrite")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzUnmarshalMessage")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, m := range sampleMessages() {
		body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(AppendMessage(nil, &m))) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, "seed"+strconv.Itoa(i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// FuzzUnmarshalMessage checks that decoding never panics, that what decodes
// re-encodes to an equal message, and that a node fed the decoded message
// never panics either (bad input is dropped and counted).
func FuzzUnmarshalMessage(f *testing.F) {
	for _, m := range sampleMessages() {
		f.Add(AppendMessage(nil, &m))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := UnmarshalMessage(b)
		if err != nil {
			return
		}
		enc := AppendMessage(nil, &m)
		if n := MessageSize(&m); n != len(enc) {
			t.Fatalf("MessageSize %d, encoding %d bytes", n, len(enc))
		}
		again, err := UnmarshalMessage(enc)
		if err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("re-encoding changed the message: %v\n%+v\n%+v", err, m, again)
		}
		for _, id := range []NodeID{1, 2} {
			n, err := NewNode(testConfig(id, []NodeID{1, 2, 3}), DurableState{})
			if err != nil {
				t.Fatal(err)
			}
			for range 30 {
				n.Tick()
			}
			m.To = id
			_ = n.Step(m)
			if n.HasReady() {
				n.Advance(n.Ready())
			}
		}
	})
}

// rewriting reports whether -rewrite (defined by the datadriven package) is
// set: it regenerates the scripted tests' expected output and this corpus.
func rewriting() bool {
	f := flag.Lookup("rewrite")
	return f != nil && f.Value.String() == "true"
}
