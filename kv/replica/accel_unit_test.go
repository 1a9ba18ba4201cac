package replica

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"synod/accel"
	"synod/kv/proto"
	"synod/paxos"
	"synod/tenants"
)

// orderLog is an in-memory AcceptorLog that records the order of appends
// and persists, and whether an Accepted was already queued when a persist
// ran (outbound is the replica's send queue).
type orderLog struct {
	mu          sync.Mutex
	events      []string
	failPersist bool
	outbound    chan []outMsg
}

func (l *orderLog) SetPromised(b paxos.Ballot) error { return nil }
func (l *orderLog) Append(es []paxos.Entry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range es {
		l.events = append(l.events, fmt.Sprintf("append %d@%d.%d", e.Slot, e.Ballot.Round, e.Ballot.Node))
	}
	return nil
}
func (l *orderLog) Persist() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, fmt.Sprintf("persist queued=%d", len(l.outbound)))
	if l.failPersist {
		return errors.New("planted persist failure")
	}
	return nil
}
func (l *orderLog) Recover(paxos.Slot) (paxos.Ballot, []paxos.Entry, error) {
	return paxos.Ballot{}, nil, nil
}
func (l *orderLog) TruncateBelow(paxos.Slot) error { return nil }
func (l *orderLog) TruncatedBelow() paxos.Slot     { return 1 }
func (l *orderLog) Usage() (int64, int64)          { return 0, 1 << 20 }
func (l *orderLog) Mode() string                   { return "memory" }
func (l *orderLog) Close() error                   { return nil }

// newAccelTestReplica builds just enough of node id of a 3-node cluster,
// with status st, to drive its accel wiring directly: a peer book, an
// orderLog for its acceptor log, and an accel mirror at ballot b.
func newAccelTestReplica(t *testing.T, id paxos.NodeID, st paxos.Status, b paxos.Ballot) (*Replica, *orderLog) {
	t.Helper()
	var peers []Peer
	for i := 1; i <= 3; i++ {
		peers = append(peers, Peer{ID: paxos.NodeID(i), ConsensusAddr: netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", 7000+i))})
	}
	r := &Replica{
		cfg: Config{ID: id, ClusterID: 9, Peers: peers, Tick: time.Millisecond, ElectionTicks: 100, HeartbeatTicks: 10,
			Accel: &AccelConfig{}, Now: time.Now},
		outbound: make(chan []outMsg, 16),
		metrics:  NewMetrics(nil),
	}
	book := &peerBook{byID: map[paxos.NodeID]Peer{}}
	for _, p := range peers {
		book.byID[p.ID] = p
	}
	r.book.Store(book)
	log := &orderLog{outbound: r.outbound}
	r.alog = log
	r.status.Store(&st)
	a, err := newAccelMirror(r, []paxos.NodeID{1, 2, 3}, b)
	if err != nil {
		t.Fatal(err)
	}
	r.accel = a
	a.registers(&st)
	return r, log
}

// newFastPathReplica builds just enough of a follower (node 2 of 3) to drive
// its accel wiring directly, with the fast path open at ballot b.
func newFastPathReplica(t *testing.T, b paxos.Ballot) (*Replica, *orderLog) {
	t.Helper()
	return newAccelTestReplica(t, 2, paxos.Status{ID: 2, Role: paxos.RoleFollower, Promised: b, Leader: b.Node}, b)
}

func acceptMsg(b paxos.Ballot, first paxos.Slot, n int) paxos.Message {
	m := paxos.Message{Type: paxos.MsgAccept, Cluster: 9, From: b.Node, To: 2, Ballot: b}
	for i := 0; i < n; i++ {
		m.Entries = append(m.Entries, paxos.Entry{Slot: first + paxos.Slot(i), Ballot: b, Type: paxos.EntryNormal,
			Cmds: [][]byte{[]byte("cmd")}})
	}
	return m
}

// TestAccelFastPathPersistsBeforeAccepted: the fast path appends and
// persists every entry before the Accepted is queued, the Accepted covers
// the range at the Accept's ballot, and the mirror reaches paxos's queue.
// A failing persist sends nothing and leaves the Accept to paxos.
func TestAccelFastPathPersistsBeforeAccepted(t *testing.T) {
	b := paxos.Ballot{Round: 3, Node: 1}
	r, log := newFastPathReplica(t, b)
	m := acceptMsg(b, 1, 3)
	if !r.accel.received(&m, true) {
		t.Fatal("the fast path declined an Accept at the promised ballot")
	}
	want := []string{"append 1@3.1", "append 2@3.1", "append 3@3.1", "persist queued=0"}
	if fmt.Sprint(log.events) != fmt.Sprint(want) {
		t.Fatalf("log order %v, want %v", log.events, want)
	}
	out := <-r.outbound
	got, err := paxos.UnmarshalMessage(out[0].b)
	if err != nil || out[0].to != 1 || got.Type != paxos.MsgAccepted || got.Ballot != b || got.Slot != 1 || got.Index != 3 || got.Reject {
		t.Fatalf("sent %+v to %d (%v), want Accepted [1,3] at %v to 1", got, out[0].to, err, b)
	}
	if mirror := <-r.accel.fast.mirrorC; mirror.Type != paxos.MsgAccept || len(mirror.Entries) != 3 {
		t.Fatalf("mirror %+v", mirror)
	}
	// Software's own Accepted for the mirror is dropped once (the fast
	// one went out), a wider or repeated one is not.
	soft := paxos.Message{Type: paxos.MsgAccepted, To: 1, Ballot: b, Slot: 1, Index: 3}
	wider := soft
	wider.Index = 4
	if r.accel.fast.alreadySent(&wider) || !r.accel.fast.alreadySent(&soft) || r.accel.fast.alreadySent(&soft) {
		t.Fatal("software's duplicate Accepted: want dropped exactly once, and only for the fast range")
	}
	// Software's Ready holding the same entries skips them.
	if left := r.accel.fast.notPersisted(m.Entries); len(left) != 0 {
		t.Fatalf("software would persist %d fast-accepted entries again", len(left))
	}

	// Planted failure: the WAL's persist fails -> nothing is sent.
	log.failPersist = true
	m2 := acceptMsg(b, 4, 1)
	if r.accel.received(&m2, true) {
		t.Fatal("the fast path took an Accept whose persist failed")
	}
	if len(r.outbound) != 0 || len(r.accel.fast.mirrorC) != 0 {
		t.Fatal("an Accepted or a mirror left after a failed persist")
	}
	if left := r.accel.fast.notPersisted(m2.Entries); len(left) != 1 {
		t.Fatal("an entry whose persist failed is marked durable")
	}
}

// TestAccelFastPathBallots: only an Accept at exactly the promised ballot
// is taken; a fence closes the path before a higher ballot is stepped, and
// a newly durable promise closes it at the old ballot.
func TestAccelFastPathBallots(t *testing.T) {
	b := paxos.Ballot{Round: 3, Node: 1}
	r, _ := newFastPathReplica(t, b)
	for _, tc := range []struct {
		name string
		m    paxos.Message
	}{
		{"stale", acceptMsg(paxos.Ballot{Round: 2, Node: 3}, 1, 1)},
		{"higher", acceptMsg(paxos.Ballot{Round: 4, Node: 3}, 1, 1)},
		{"beyond window", acceptMsg(b, accelWindowSlots+5, 1)},
		{"foreign cluster", func() paxos.Message { m := acceptMsg(b, 1, 1); m.Cluster = 8; return m }()},
	} {
		m := tc.m
		if r.accel.received(&m, true) {
			t.Errorf("%s: the fast path took it", tc.name)
		}
	}
	prep := paxos.Message{Type: paxos.MsgPrepare, Cluster: 9, From: 3, To: 2, Ballot: paxos.Ballot{Round: 4, Node: 3}, Slot: 1}
	if !r.accel.fast.needsFence(&prep) {
		t.Fatal("a Prepare above the open ballot needs no fence")
	}
	same := acceptMsg(b, 1, 1)
	if r.accel.fast.needsFence(&same) {
		t.Fatal("an Accept at the open ballot fences")
	}
	r.accel.promisedDurable(paxos.Ballot{Round: 4, Node: 3})
	m := acceptMsg(b, 1, 1)
	if r.accel.received(&m, true) {
		t.Fatal("the fast path took the old ballot after a higher promise was durable")
	}
}

// TestAccelCheckBounded: the bounded checker forgets judged slots, counts
// agreement over a long run, and catches planted disagreements.
func TestAccelCheckBounded(t *testing.T) {
	c := newAccelCheck()
	b := paxos.Ballot{Round: 1, Node: 1}
	const slots = 20 * checkLagSlotsMax
	for s := paxos.Slot(1); s <= slots; s++ {
		c.plane([]accel.Event{{Kind: accel.OutCommit, Slot: s, Ballot: b}})
		c.software([]paxos.AckEvent{{Slot: s, Ballot: b, Committed: true}})
		c.forgetBelow(s)
		if c.held() > checkLagSlotsMax+1 {
			t.Fatalf("holding %d slots at slot %d", c.held(), s)
		}
	}
	if r := c.result(); r.Commits != slots || r.Mismatches != 0 {
		t.Fatalf("%v, want commits=%d mismatches=0", r, slots)
	}
	// Planted: the plane commits another ballot; the plane commits a slot
	// software skipped while committing a higher one at the same ballot;
	// software commits one the plane handed up (excused); the plane
	// commits at a ballot software stopped leading before counting it
	// (excused: timing).
	s := paxos.Slot(slots)
	c.plane([]accel.Event{{Kind: accel.OutCommit, Slot: s + 1, Ballot: paxos.Ballot{Round: 2, Node: 2}}})
	c.software([]paxos.AckEvent{{Slot: s + 1, Ballot: b, Committed: true}})
	c.plane([]accel.Event{{Kind: accel.OutCommit, Slot: s + 2, Ballot: b}})
	c.plane([]accel.Event{{Kind: accel.OutHandUp, Len: uint32(accel.InAccepted), Slot: s + 3, Ballot: b}})
	c.software([]paxos.AckEvent{{Slot: s + 3, Ballot: b, Committed: true}})
	c.plane([]accel.Event{{Kind: accel.OutCommit, Slot: s + 4, Ballot: paxos.Ballot{Round: 3, Node: 3}}})
	if r := c.result(); r.Mismatches != 0 {
		t.Fatalf("slots above the commit index judged: %v", r)
	}
	c.forgetBelow(s + 4 + checkLagSlotsMax + 1)
	r := c.result()
	if r.Mismatches != 2 || r.Excused != 2 || r.First == "" || c.held() != 0 {
		t.Fatalf("%v excused=%d first=%q held=%d, want 2 mismatches, 2 excused", r, r.Excused, r.First, c.held())
	}
	// The table never outgrows checkSlotsMax even without forgetBelow.
	for i := paxos.Slot(0); i < checkSlotsMax+16; i++ {
		c.plane([]accel.Event{{Kind: accel.OutHandUp, Len: uint32(accel.InArm), Slot: 1 << 40 * i}})
	}
	if c.held() > checkSlotsMax {
		t.Fatalf("holding %d > %d slots", c.held(), checkSlotsMax)
	}
}

func TestAccelFrameRoundTrip(t *testing.T) {
	f := accelFrame{kind: accelFrameAck, cluster: 9, from: 2, to: 1, ballot: paxos.Ballot{Round: 7, Node: 1}, sentAt: 12345}
	b := appendAccelFrame(nil, &f)
	if len(b) != accelFrameBytes || !isAccelFrame(b) {
		t.Fatalf("frame of %d bytes", len(b))
	}
	got, err := parseAccelFrame(b)
	if err != nil || got != f {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	// A paxos message never looks like an accel frame.
	if isAccelFrame(paxos.AppendMessage(nil, &paxos.Message{Type: paxos.MsgHeartbeat, Cluster: 9, From: 1, To: 2})) {
		t.Fatal("a paxos message reads as an accel frame")
	}
	if _, err := parseAccelFrame(b[:len(b)-1]); err == nil {
		t.Fatal("short frame accepted")
	}
}

func FuzzParseAccelFrame(f *testing.F) {
	f.Add(appendAccelFrame(nil, &accelFrame{kind: accelFrameHeartbeat, cluster: 9, from: 1, to: 2, ballot: paxos.Ballot{Round: 1, Node: 1}}))
	f.Add([]byte{accelFrameMagic})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := parseAccelFrame(b)
		if err != nil {
			return
		}
		if !bytes.Equal(appendAccelFrame(nil, &fr), b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// TestAccelAdmitter: the plane's shaper admits a tenant's burst, then
// refuses with a retry-after; unknown tenants are refused without one.
func TestAccelAdmitter(t *testing.T) {
	reg, err := tenants.NewRegistry([]tenants.Spec{{ID: 7, Name: "t7", Token: "token-seven-1", OpsPerSec: 10, OpsBurst: 10}})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := newFastPathReplica(t, paxos.Ballot{Round: 1, Node: 1})
	ad, err := r.AccelAdmitter(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	var wait time.Duration
	for i := 0; i < 11; i++ {
		ok, w := ad.Admit(7, proto.OpPut, 100)
		if ok {
			admitted++
		} else {
			wait = w
		}
	}
	if admitted != 10 || wait <= 0 || wait > 200*time.Millisecond {
		t.Fatalf("admitted %d of 11 (burst 10), retry-after %v", admitted, wait)
	}
	if ok, w := ad.Admit(8, proto.OpPut, 100); ok || w != 0 {
		t.Fatalf("unknown tenant: %v %v", ok, w)
	}
	off := &Replica{}
	if _, err := off.AccelAdmitter(reg, nil); !errors.Is(err, ErrAccelOff) {
		t.Fatalf("accel off: %v", err)
	}
}
