package paxos

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// laggingFollower builds a group whose leader compacted past what follower
// f holds, with f back up: the next heartbeat round offers f the snapshot.
// Offers are not fetched by the harness (nw.noFetch).
func laggingFollower(t *testing.T) (nw *network, l, f NodeID) {
	nw = newNetwork(t, 3)
	nw.noFetch = true
	l = nw.elect()
	f = others(nw, l)[0]
	nw.crash(f)
	for i := range 10 {
		nw.propose(l, fmt.Sprint(i))
	}
	nw.tick(1)
	if err := nw.compact(l, []byte("state")); err != nil {
		t.Fatal(err)
	}
	nw.restart(f)
	return nw, l, f
}

// TestSnapshotOfferIsMetadataOnly: a lagging follower's Ready carries an
// offer naming the leader and its compaction slot; nothing changes on the
// follower until InstallSnapshot, and the MsgSnapshot on the wire carries
// no state.
func TestSnapshotOfferIsMetadataOnly(t *testing.T) {
	nw, l, f := laggingFollower(t)
	var sent *Message
	nw.dropNext = func(m Message) bool {
		if m.Type == MsgSnapshot && m.To == f {
			c := m
			sent = &c
		}
		return false
	}
	nw.tick(3)
	if sent == nil {
		t.Fatal("no MsgSnapshot sent to the lagging follower")
	}
	// version, type, flags, 10 u64 header fields, entry count, slot,
	// member count, three members, learner count: no state bytes.
	if got, want := len(AppendMessage(nil, sent)), 3+8*10+4+8+4+3*8+4; got != want {
		t.Fatalf("MsgSnapshot encodes to %d bytes, want %d (metadata only)", got, want)
	}
	offer := nw.offers[f]
	if offer == nil {
		t.Fatal("the lagging follower's Ready carried no snapshot offer")
	}
	snap := nw.nodes[l].snap
	if offer.From != l || offer.Meta.Slot != snap.Slot || !slices.Equal(offer.Meta.Members, snap.Members) {
		t.Fatalf("offer %+v, leader's snapshot %+v", *offer, *snap)
	}
	if st := nw.nodes[f].Status(); st.Commit >= snap.Slot || nw.snaps[f] != nil {
		t.Fatalf("follower moved before InstallSnapshot: commit %d, installed %v", st.Commit, nw.snaps[f])
	}
}

// TestInstallSnapshot: InstallSnapshot of a fetched state above the commit
// index resets the log and commit, its Ready names the snapshot before any
// later entry, and the node catches up from the leader's log after it.
func TestInstallSnapshot(t *testing.T) {
	nw, l, f := laggingFollower(t)
	nw.tick(3)
	offer := nw.offers[f]
	if offer == nil {
		t.Fatal("no offer")
	}
	nw.propose(l, "after")
	nw.noFetch = false
	nw.fetch(f, offer)
	n := nw.nodes[f]
	if st := n.Status(); st.Commit != offer.Meta.Slot || st.FirstSlot != offer.Meta.Slot+1 {
		t.Fatalf("after InstallSnapshot: commit %d first %d, want %d and %d", st.Commit, st.FirstSlot, offer.Meta.Slot, offer.Meta.Slot+1)
	}
	rd := n.Ready()
	if rd.Snapshot == nil || rd.Snapshot.Slot != offer.Meta.Slot || len(rd.Committed) != 0 {
		t.Fatalf("Ready after InstallSnapshot: snapshot %+v, %d committed", rd.Snapshot, len(rd.Committed))
	}
	if n.Status().Applied >= offer.Meta.Slot {
		t.Fatal("applied moved before Advance")
	}
	nw.readyDone(f, rd)
	if got := n.Status().Applied; got != offer.Meta.Slot {
		t.Fatalf("applied %d after Advance, want %d", got, offer.Meta.Slot)
	}
	nw.tick(5)
	if got := nw.cmds(f); !slices.Equal(got, []string{"after"}) {
		t.Fatalf("after the snapshot the follower applied %v", got)
	}
	nw.checkAgree()
}

// TestInstallSnapshotStale: a transfer that arrives after the node caught
// up by other means (or an older one) is refused and changes nothing.
func TestInstallSnapshotStale(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.propose(l, "a", "b")
	nw.tick(2)
	f := others(nw, l)[0]
	n := nw.nodes[f]
	before := n.Status()
	for _, slot := range []Slot{1, before.Commit} {
		err := n.InstallSnapshot(SnapshotMeta{Slot: slot, Members: nw.ids})
		if !errors.Is(err, ErrSnapshotStale) {
			t.Fatalf("InstallSnapshot at %d with commit %d: %v, want ErrSnapshotStale", slot, before.Commit, err)
		}
	}
	if n.HasReady() {
		t.Fatalf("a refused InstallSnapshot left output: %+v", n.Ready())
	}
	if after := n.Status(); !reflect.DeepEqual(after, before) {
		t.Fatalf("a refused InstallSnapshot changed the node:\n%+v\n%+v", before, after)
	}
	for _, bad := range []SnapshotMeta{{Slot: 0, Members: nw.ids}, {Slot: 99}, {Slot: 99, Members: []NodeID{1, 0}},
		{Slot: slotMax + 1, Members: nw.ids}} {
		if err := n.InstallSnapshot(bad); !errors.Is(err, ErrBadMessage) {
			t.Fatalf("InstallSnapshot(%+v): %v, want ErrBadMessage", bad, err)
		}
	}
}

// TestSnapshotOfferNewestWins: of several offers before a Ready, the one
// at the highest slot is handed out; offers at or below commit are not.
func TestSnapshotOfferNewestWins(t *testing.T) {
	n, err := NewNode(testConfig(1, []NodeID{1, 2, 3}), DurableState{})
	if err != nil {
		t.Fatal(err)
	}
	offer := func(from NodeID, slot Slot) {
		m := Message{Type: MsgSnapshot, Cluster: 7, From: from, To: 1, Commit: slot,
			Snapshot: &SnapshotMeta{Slot: slot, Members: []NodeID{1, 2, 3}}}
		if err := n.Step(m); err != nil {
			t.Fatal(err)
		}
	}
	offer(2, 40)
	offer(3, 30)
	offer(3, 50)
	offer(2, 45)
	rd := n.Ready()
	if o := rd.SnapshotOffer; o == nil || o.From != 3 || o.Meta.Slot != 50 {
		t.Fatalf("offer %+v, want node 3's at 50", o)
	}
	n.Advance(rd)
	if n.HasReady() {
		t.Fatal("the offer was handed out twice")
	}
}

// TestSnapshotMetaAt: the metadata of a snapshot after slot names the
// membership in force above it, and is refused where the node cannot know
// it (below its log, above its commit index).
func TestSnapshotMetaAt(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.propose(l, "a")
	nw.tick(1)
	n := nw.nodes[l]
	gone := others(nw, l)[1]
	if err := n.ProposeConfChange(ConfChange{Type: ConfRemoveNode, Node: gone}); err != nil {
		t.Fatal(err)
	}
	nw.settle()
	cc := n.commit
	nw.propose(l, "b")
	nw.tick(1)
	after := slices.DeleteFunc(slices.Clone(nw.ids), func(id NodeID) bool { return id == gone })
	for _, c := range []struct {
		slot    Slot
		members []NodeID
	}{{cc - 1, []NodeID{1, 2, 3}}, {cc, after}, {n.commit, after}} {
		m, err := n.SnapshotMetaAt(c.slot)
		if err != nil || m.Slot != c.slot || !slices.Equal(m.Members, c.members) {
			t.Fatalf("SnapshotMetaAt(%d) = %+v, %v; want members %v", c.slot, m, err, c.members)
		}
	}
	if _, err := n.SnapshotMetaAt(n.commit + 1); err == nil {
		t.Fatal("metadata above the commit index")
	}
	if err := nw.compact(l, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := n.SnapshotMetaAt(n.log.first - 2); err == nil {
		t.Fatal("metadata below the compacted log")
	}
	if m, err := n.SnapshotMetaAt(n.log.first - 1); err != nil || !slices.Equal(m.Members, after) {
		t.Fatalf("metadata at the compaction point: %+v, %v", m, err)
	}
}

// TestRestartedNodeOffersSnapshot: a node restarted from a durable
// snapshot's metadata offers it to a laggard at once (it needs no state in
// memory: the application serves the state).
func TestRestartedNodeOffersSnapshot(t *testing.T) {
	nw, l, f := laggingFollower(t)
	nw.crash(f)
	nw.crash(l)
	nw.restart(l)
	nw.restart(f)
	nw.tick(40)
	if nw.offers[f] == nil || nw.offers[f].From == f {
		t.Fatalf("the lagging node got no offer after its peers restarted: %+v", nw.offers[f])
	}
}

// TestFuzzCorpusIsCurrent keeps the seed corpus useful: every seed decodes
// under the current codec version (regenerate with
// go test ./paxos -run TestWriteFuzzCorpus -rewrite after a format change).
func TestFuzzCorpusIsCurrent(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzUnmarshalMessage")
	files, err := os.ReadDir(dir)
	if err != nil || len(files) == 0 {
		t.Fatalf("corpus %s: %v (%d files)", dir, err, len(files))
	}
	for _, fe := range files {
		b, err := os.ReadFile(filepath.Join(dir, fe.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[1], "[]byte(") {
			t.Fatalf("%s: not a go fuzz v1 []byte seed", fe.Name())
		}
		q := strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")")
		raw, err := strconv.Unquote(q)
		if err != nil {
			t.Fatalf("%s: %v", fe.Name(), err)
		}
		if _, err := UnmarshalMessage([]byte(raw)); err != nil {
			t.Fatalf("%s does not decode under codec version %d: %v", fe.Name(), codecVersion, err)
		}
	}
}

// TestCodecRefusesOldSnapshotFormat: a version-1 MsgSnapshot (with its
// state inline) is refused, never misread as version 2.
func TestCodecRefusesOldSnapshotFormat(t *testing.T) {
	m := Message{Type: MsgSnapshot, Cluster: 7, From: 2, To: 1, Commit: 8, Snapshot: &SnapshotMeta{Slot: 8, Members: []NodeID{1, 2, 3}}}
	b := AppendMessage(nil, &m)
	b = append(b, 3, 0, 0, 0, 'a', 'b', 'c') // version 1's data length and bytes
	b[0] = 1
	if _, err := UnmarshalMessage(b); !errors.Is(err, errDecode) {
		t.Fatalf("a version-1 snapshot message decoded: %v", err)
	}
}

// TestUnmarshalSnapshotMetaMalformed: every prefix, a trailing byte and a
// hostile member count are errors, never panics or large allocations.
func TestUnmarshalSnapshotMetaMalformed(t *testing.T) {
	want := SnapshotMeta{Slot: 77, Members: []NodeID{1, 5, 9}}
	b := AppendSnapshotMeta(nil, &want)
	got, err := UnmarshalSnapshotMeta(b)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for i := range b {
		if _, err := UnmarshalSnapshotMeta(b[:i]); err == nil {
			t.Fatalf("prefix of %d/%d bytes decoded", i, len(b))
		}
	}
	if _, err := UnmarshalSnapshotMeta(append(b, 0)); err == nil {
		t.Fatal("trailing byte accepted")
	}
	huge := append(AppendSnapshotMeta(nil, &SnapshotMeta{Slot: 1}), 0)[:12]
	huge[8], huge[9], huge[10], huge[11] = 0xff, 0xff, 0xff, 0x7f
	if _, err := UnmarshalSnapshotMeta(huge); !errors.Is(err, errDecode) {
		t.Fatalf("a member count of 2^31 decoded: %v", err)
	}
	many := AppendSnapshotMeta(nil, &SnapshotMeta{Slot: 1, Members: make([]NodeID, MembersMax)})
	many[8] = MembersMax + 1
	if _, err := UnmarshalSnapshotMeta(many); !errors.Is(err, errDecode) {
		t.Fatalf("%d members decoded: %v", MembersMax+1, err)
	}
}

// FuzzUnmarshalSnapshotMeta: decoding never panics and what decodes
// re-encodes to the same bytes.
func FuzzUnmarshalSnapshotMeta(f *testing.F) {
	f.Add(AppendSnapshotMeta(nil, &SnapshotMeta{Slot: 9, Members: []NodeID{1, 2, 3}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := UnmarshalSnapshotMeta(b)
		if err != nil {
			return
		}
		if again := AppendSnapshotMeta(nil, &m); string(again) != string(b) {
			t.Fatalf("re-encoding changed the metadata: %x -> %x", b, again)
		}
	})
}
