package accel

import (
	"errors"
	"math/rand"
	"testing"

	"synod/paxos"
	"synod/pmem"
)

func b(round uint64, node paxos.NodeID) paxos.Ballot { return paxos.Ballot{Round: round, Node: node} }

// newLeader builds a leader plane over nodes 1..replicas with self = node 1.
func newLeader(t *testing.T, replicas, quorum, window int) *Plane {
	t.Helper()
	spec := DefaultSpec()
	spec.Replicas, spec.Quorum, spec.WindowSlots = replicas, quorum, window
	p, err := New(spec)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < replicas; i++ {
		p.SetMember(nil, i, paxos.NodeID(i+1))
	}
	p.SetSelf(nil, 0)
	p.SetBallot(nil, b(1, 1))
	p.SetWindowBase(nil, 1)
	p.SetRole(nil, RoleLeader)
	return p
}

func kinds(evs []Event) []Kind {
	var ks []Kind
	for _, e := range evs {
		ks = append(ks, e.Kind)
	}
	return ks
}

func countKind(evs []Event, k Kind) int {
	n := 0
	for _, e := range evs {
		if e.Kind == k {
			n++
		}
	}
	return n
}

func TestSpecValidate(t *testing.T) {
	if err := DefaultSpec().Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []func(*Spec){
		func(s *Spec) { s.WindowSlots = 3000 },
		func(s *Spec) { s.WindowSlots = 0 },
		func(s *Spec) { s.Replicas = ReplicasMax + 1 },
		func(s *Spec) { s.Quorum = s.Replicas + 1 },
		func(s *Spec) { s.Quorum = 0 },
		func(s *Spec) { s.HeartbeatPeriodTicks = 0 },
		func(s *Spec) { s.LeaseDriftTicks = s.LeaseTicks },
		func(s *Spec) { s.ElectionJitterTicks = 3 },
		func(s *Spec) { s.HeartbeatPeriodTicks = s.ElectionTicks },
		func(s *Spec) { s.TenantsMax = TenantsMax + 1 },
	}
	for i, f := range bad {
		s := DefaultSpec()
		f(&s)
		if _, err := New(s); !errors.Is(err, ErrBadSpec) {
			t.Errorf("case %d: New accepted %+v (err %v)", i, s, err)
		}
	}
}

func TestAggregatorQuorum(t *testing.T) {
	for _, tc := range []struct{ replicas, quorum int }{{3, 2}, {5, 3}, {1, 1}} {
		p := newLeader(t, tc.replicas, tc.quorum, 64)
		ballot := b(1, 1)
		out := p.Arm(nil, 5, ballot)
		if tc.quorum == 1 {
			if countKind(out, OutCommit) != 1 {
				t.Fatalf("quorum 1: Arm gave %v, want one commit", kinds(out))
			}
			continue
		}
		commits := 0
		// Acks from every other member, each twice (duplicates are harmless).
		for from := 2; from <= tc.replicas; from++ {
			for dup := 0; dup < 2; dup++ {
				out = p.OnAccepted(nil, 5, ballot, paxos.NodeID(from))
				commits += countKind(out, OutCommit)
				if countKind(out, OutHandUp) != 0 {
					t.Fatalf("ack from %d handed up: %v", from, out)
				}
				if from < tc.quorum && commits != 0 {
					t.Fatalf("%d/%d: committed after %d acks", tc.quorum, tc.replicas, from)
				}
				if from == tc.quorum && commits != 1 {
					t.Fatalf("%d/%d: no commit after %d acks", tc.quorum, tc.replicas, from)
				}
			}
		}
		if commits != 1 {
			t.Fatalf("%d/%d: %d commit events, want exactly 1", tc.quorum, tc.replicas, commits)
		}
	}
}

func TestAggregatorOutOfOrderAndDuplicates(t *testing.T) {
	const slots = 200
	p := newLeader(t, 5, 3, 256)
	ballot := b(1, 1)
	type ack struct {
		slot paxos.Slot
		from paxos.NodeID
	}
	var acks []ack
	for s := paxos.Slot(1); s <= slots; s++ {
		p.Arm(nil, s, ballot)
		for from := paxos.NodeID(2); from <= 5; from++ {
			acks = append(acks, ack{s, from}, ack{s, from}) // every ack twice
		}
	}
	rng := rand.New(rand.NewSource(7))
	rng.Shuffle(len(acks), func(i, j int) { acks[i], acks[j] = acks[j], acks[i] })
	perSlot := map[paxos.Slot]int{}
	for _, a := range acks {
		for _, e := range p.OnAccepted(nil, a.slot, ballot, a.from) {
			switch e.Kind {
			case OutCommit:
				perSlot[e.Slot]++
			default:
				t.Fatalf("unexpected %v", e)
			}
		}
	}
	for s := paxos.Slot(1); s <= slots; s++ {
		if perSlot[s] != 1 {
			t.Fatalf("slot %d: %d commits, want 1", s, perSlot[s])
		}
	}
}

func TestAggregatorHandsUp(t *testing.T) {
	p := newLeader(t, 3, 2, 16) // window [1, 17)
	cur, old := b(2, 1), b(1, 1)
	p.SetBallot(nil, cur)
	p.Arm(nil, 3, cur)
	cases := []struct {
		name string
		out  []Event
		want Reason
	}{
		{"stale ballot", p.OnAccepted(nil, 3, old, 2), ReasonBallot},
		{"higher ballot", p.OnAccepted(nil, 3, b(3, 2), 2), ReasonBallot},
		{"not armed", p.OnAccepted(nil, 4, cur, 2), ReasonNotArmed},
		{"aliased row", p.OnAccepted(nil, 3+16, cur, 2), ReasonWindow},
		{"beyond window", p.Arm(nil, 17, cur), ReasonWindow},
		{"below window", p.OnAccepted(nil, 0, cur, 2), ReasonWindow},
		{"not a member", p.OnAccepted(nil, 3, cur, 9), ReasonMember},
	}
	for _, c := range cases {
		if len(c.out) != 1 || c.out[0].Kind != OutHandUp || c.out[0].Reason() != c.want {
			t.Errorf("%s: got %v, want one hand-up %d", c.name, c.out, c.want)
		}
	}
	// A row armed at an older ballot of ours, then re-election at a newer
	// one: a late ack at the row's ballot is handed up (paxossim seed 564).
	p.Arm(nil, 5, cur)
	p.SetBallot(nil, b(4, 1))
	if out := p.OnAccepted(nil, 5, cur, 2); len(out) != 1 || out[0].Kind != OutHandUp || out[0].Reason() != ReasonBallot {
		t.Errorf("late ack at a superseded ballot: got %v, want one hand-up %d", out, ReasonBallot)
	}
	p.SetBallot(nil, cur)
	// None of that moved the count: one real ack still commits.
	if out := p.OnAccepted(nil, 3, cur, 2); countKind(out, OutCommit) != 1 {
		t.Fatalf("real ack after junk: %v", out)
	}
	// Moving the window makes the aliased row reachable and the old slot not.
	p.SetWindowBase(nil, 10)
	p.Arm(nil, 3+16, cur)
	if out := p.OnAccepted(nil, 3+16, cur, 3); countKind(out, OutCommit) != 1 {
		t.Fatalf("aliased slot after window move: %v", out)
	}
	if out := p.OnAccepted(nil, 3, cur, 3); len(out) != 1 || out[0].Reason() != ReasonWindow {
		t.Fatalf("slot below the moved window: %v", out)
	}
	// A follower's plane hands up leader inputs.
	p.SetRole(nil, RoleFollower)
	if out := p.OnAccepted(nil, 12, cur, 2); len(out) != 1 || out[0].Reason() != ReasonRole {
		t.Fatalf("follower got Accepted: %v", out)
	}
}

// fakeWAL records calls in order and can fail.
type fakeWAL struct {
	calls    []string
	recs     []pmem.Record
	promised pmem.Ballot
	fail     bool
}

func (w *fakeWAL) Append(rs []pmem.Record) error {
	w.calls = append(w.calls, "append")
	if w.fail {
		return errors.New("disk on fire")
	}
	for _, r := range rs {
		r.Payload = append([]byte(nil), r.Payload...)
		w.recs = append(w.recs, r)
	}
	return nil
}
func (w *fakeWAL) Persist() error { w.calls = append(w.calls, "persist"); return nil }
func (w *fakeWAL) SetPromised(b pmem.Ballot) error {
	w.calls = append(w.calls, "promise")
	w.promised = b
	return nil
}

func newFollower(t *testing.T, w WAL) *Plane {
	t.Helper()
	spec := DefaultSpec()
	spec.Replicas, spec.Quorum, spec.WindowSlots = 3, 2, 64
	p, err := New(spec, WithWAL(w))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		p.SetMember(nil, i, paxos.NodeID(i+1))
	}
	p.SetSelf(nil, 1)
	p.SetPromised(nil, b(1, 1))
	p.SetWindowBase(nil, 1)
	p.SetRole(nil, RoleFollower)
	return p
}

func TestAcceptFastPath(t *testing.T) {
	w := &fakeWAL{}
	p := newFollower(t, w)
	out := p.OnAccept(nil, 1, b(1, 1), 1, []byte("v1"))
	if got := kinds(out); len(got) != 2 || got[0] != OutSendAccepted || got[1] != OutMirror {
		t.Fatalf("accept: %v", out)
	}
	// PMem before Accepted: by the time SendAccepted exists, both calls ran.
	if len(w.calls) != 2 || w.calls[0] != "append" || w.calls[1] != "persist" {
		t.Fatalf("WAL calls %v before SendAccepted", w.calls)
	}
	if out[0].Node != 1 || out[0].Slot != 1 || out[0].Ballot != b(1, 1) {
		t.Fatalf("SendAccepted fields: %v", out[0])
	}
	if len(w.recs) != 1 || w.recs[0].Slot != 1 || string(w.recs[0].Payload) != "v1" || w.recs[0].Type != pmem.RecordEntry {
		t.Fatalf("WAL holds %+v", w.recs)
	}

	// Leader change: node 3 takes over with ballot (2,3) without this node's promise.
	out = p.OnAccept(nil, 2, b(2, 3), 3, []byte("v2"))
	if countKind(out, OutSendAccepted) != 1 || w.promised != (pmem.Ballot{Round: 2, Node: 3}) {
		t.Fatalf("new leader's accept: %v, promised %v", out, w.promised)
	}
	if w.calls[2] != "promise" {
		t.Fatalf("promise not persisted before the append: %v", w.calls)
	}
	// The old leader is now stale: handed up, nothing persisted.
	n := len(w.calls)
	out = p.OnAccept(nil, 3, b(1, 1), 1, []byte("stale"))
	if len(out) != 1 || out[0].Kind != OutHandUp || out[0].Reason() != ReasonStaleBallot || len(w.calls) != n {
		t.Fatalf("stale accept: %v, calls %v", out, w.calls[n:])
	}
	// Out of window: handed up.
	if out = p.OnAccept(nil, 65, b(2, 3), 3, nil); len(out) != 1 || out[0].Reason() != ReasonWindow {
		t.Fatalf("beyond window: %v", out)
	}
	// A failing WAL: handed up, no Accepted.
	w.fail = true
	if out = p.OnAccept(nil, 4, b(2, 3), 3, []byte("x")); len(out) != 1 || out[0].Reason() != ReasonWAL {
		t.Fatalf("WAL failure: %v", out)
	}
	// Without a WAL the fast path declines everything.
	p2 := newFollower(t, nil)
	if out = p2.OnAccept(nil, 1, b(1, 1), 1, nil); len(out) != 1 || out[0].Reason() != ReasonWAL {
		t.Fatalf("no WAL: %v", out)
	}
}

func TestAcceptHigherBallotNeedsPromiser(t *testing.T) {
	w := &struct{ WAL }{&fakeWAL{}} // hides SetPromised
	p := newFollower(t, w)
	if out := p.OnAccept(nil, 1, b(1, 1), 1, nil); countKind(out, OutSendAccepted) != 1 {
		t.Fatalf("equal ballot: %v", out)
	}
	if out := p.OnAccept(nil, 2, b(5, 3), 3, nil); len(out) != 1 || out[0].Reason() != ReasonWAL {
		t.Fatalf("higher ballot without a Promiser: %v", out)
	}
}

func TestAcceptWithPmemLog(t *testing.T) {
	l := openTestLog(t)
	p := newFollower(t, l)
	out := p.OnAccept(nil, 1, b(1, 1), 1, []byte("hello"))
	if countKind(out, OutSendAccepted) != 1 {
		t.Fatalf("accept on pmem: %v", out)
	}
	var got []pmem.Record
	if err := l.Iterate(0, func(r pmem.Record) error { got = append(got, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Slot != 1 || string(got[0].Payload) != "hello" {
		t.Fatalf("pmem log holds %+v", got)
	}
}

func TestAcceptedRange(t *testing.T) {
	p := newLeader(t, 3, 2, 16)
	for s := paxos.Slot(1); s <= 4; s++ {
		p.Arm(nil, s, b(1, 1))
	}
	out := p.OnAcceptedRange(nil, 1, 4, b(1, 1), 2)
	if countKind(out, OutCommit) != 4 {
		t.Fatalf("range ack: %v", kinds(out))
	}
	// A range longer than the window is cut: 16 slots are fed (1..4 count
	// silently, 5..16 were never armed) and the tail is one hand-up.
	out = p.OnAcceptedRange(nil, 1, 1000, b(1, 1), 3)
	if n := len(out); n != 13 || out[n-1].Reason() != ReasonWindow || out[0].Reason() != ReasonNotArmed {
		t.Fatalf("long range: %d outputs, last %v", n, out[n-1])
	}
}
