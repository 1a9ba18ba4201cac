package paxos

import (
	"slices"
	"testing"
)

// ownPersists models, in the test network, the caller's asynchronous
// persist of a leader's own acceptances (Ready.OwnAccepted): by default
// each one is durable and reported as soon as its Ready is handled; on a
// node a test holds, it waits until the test completes it (persistOwn) or
// drops it (a crash before the write reached the disk).
type ownPersists struct {
	held    map[NodeID]bool
	pending map[NodeID][][]Entry
}

func (o *ownPersists) hold(id NodeID) {
	if o.held == nil {
		o.held, o.pending = map[NodeID]bool{}, map[NodeID][][]Entry{}
	}
	o.held[id] = true
}

// ownAccepted takes rd.OwnAccepted of node id after its Ready was handled.
func (nw *network) ownAccepted(id NodeID, es []Entry) {
	if len(es) == 0 {
		return
	}
	if nw.own.held[id] {
		nw.own.pending[id] = append(nw.own.pending[id], slices.Clone(es))
		return
	}
	nw.writeOwn(id, es)
}

// writeOwn makes es durable on id and reports it. A node's acceptances of
// one slot carry non-decreasing ballots, so a write that lands after a later
// one for its slot (an own write completing late) is superseded by it.
func (nw *network) writeOwn(id NodeID, es []Entry) {
	d := nw.durable[id]
	for _, e := range es {
		if old, ok := d.accepted[e.Slot]; ok && e.Ballot.Less(old.Ballot) {
			continue
		}
		nw.store(id, e)
	}
	if n := nw.nodes[id]; n != nil && !nw.down[id] {
		n.OwnAcceptedDurable(es[0].Ballot, es[0].Slot, es[len(es)-1].Slot)
	}
}

// persistOwn completes every held own write of id, in order, and stops
// holding.
func (nw *network) persistOwn(id NodeID) {
	p := nw.own.pending[id]
	delete(nw.own.pending, id)
	delete(nw.own.held, id)
	for _, es := range p {
		nw.writeOwn(id, es)
	}
}

// loseOwn drops id's held own writes: it crashed before they completed.
func (nw *network) loseOwn(id NodeID) {
	delete(nw.own.pending, id)
	delete(nw.own.held, id)
}

func ackFrom(acks []AckEvent, s Slot, from NodeID) bool {
	for _, a := range acks {
		if a.Slot == s && a.From == from {
			return true
		}
	}
	return false
}

// The leader's acceptance counts toward the quorum only once the caller
// reported it durable: with one follower cut off, the other's ack alone
// does not commit.
func TestOwnVoteCountsOnlyWhenDurable(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	f := others(nw, l)
	nw.cut[[2]NodeID{l, f[1]}] = true
	nw.own.hold(l)
	n := nw.nodes[l]
	before := n.Status().Commit
	nw.propose(l, "x")
	s := n.Status().LastSlot
	if c := n.Status().Commit; c != before {
		t.Fatalf("commit moved from %d to %d on one follower's ack while the leader's own acceptance is not durable", before, c)
	}
	if ackFrom(nw.acks[l], s, l) {
		t.Fatal("the leader reported an AckEvent from itself before its acceptance was durable")
	}
	if _, ok := nw.durable[l].accepted[s]; ok {
		t.Fatal("the held own write is already durable")
	}
	nw.persistOwn(l)
	nw.settle()
	if c := n.Status().Commit; c < s {
		t.Fatalf("commit %d after the own write of slot %d completed", c, s)
	}
	if !ackFrom(nw.acks[l], s, l) {
		t.Fatal("no AckEvent from the leader itself after its persist")
	}
	if got := nw.cmds(l); !slices.Contains(got, "x") {
		t.Fatalf("leader applied %v", got)
	}
}

// Both followers can choose a value without the leader; the leader still
// delivers it only once its own copy is durable, so it never applies a
// slot it could lose in a crash. Followers apply it at once.
func TestOwnVoteDeliveryWaitsForDurable(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.own.hold(l)
	n := nw.nodes[l]
	nw.propose(l, "x")
	s := n.Status().LastSlot
	if c := n.Status().Commit; c < s {
		t.Fatalf("both followers acked slot %d, commit is %d", s, c)
	}
	nw.tick(2) // the followers learn the commit from heartbeats
	for _, f := range others(nw, l) {
		if !slices.Contains(nw.cmds(f), "x") {
			t.Fatalf("follower %d did not apply the committed value", f)
		}
	}
	if slices.Contains(nw.cmds(l), "x") || n.Status().Applied >= s {
		t.Fatalf("leader delivered slot %d before its own acceptance was durable", s)
	}
	nw.propose(l, "y") // later slots wait behind it too
	if slices.Contains(nw.cmds(l), "y") {
		t.Fatal("a later slot was delivered past one held back")
	}
	nw.persistOwn(l)
	nw.settle()
	if got := nw.cmds(l); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("leader applied %v after its persists completed", got)
	}
	nw.checkAgree()
}

// A leader that crashes before its own write completes loses it; nothing
// it acknowledged can be lost with it, because it neither counted nor
// applied the slot.
func TestOwnVoteLostInCrashCommitsNothing(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	f := others(nw, l)
	nw.cut[[2]NodeID{l, f[1]}] = true
	nw.own.hold(l)
	nw.propose(l, "x")
	s := nw.nodes[l].Status().LastSlot
	nw.tick(2)
	if slices.Contains(nw.cmds(f[0]), "x") {
		t.Fatal("a follower applied a value only it had durably accepted")
	}
	nw.crash(l)
	nw.loseOwn(l)
	if _, ok := nw.durable[l].accepted[s]; ok {
		t.Fatal("the lost own write is durable")
	}
	nw.heal()
	nw.restart(l)
	nw.elect()
	nw.tick(5)
	nw.checkAgree()
}

// The planted bug, counted before durable, loses an acknowledged write in
// exactly the schedule the simulator hunts for: the leader commits with
// one follower, that follower applies, the leader crashes before its own
// write lands, the follower is down, and the other two elect a leader that
// never heard of the value. Without the bug the same schedule is safe (the
// test above).
func TestPlantedVoteBeforePersistLosesAWrite(t *testing.T) {
	TestingVoteBeforePersist = true
	defer func() { TestingVoteBeforePersist = false }()
	nw := newNetwork(t, 3)
	l := nw.elect()
	f := others(nw, l)
	nw.cut[[2]NodeID{l, f[1]}] = true
	nw.own.hold(l)
	nw.propose(l, "x")
	nw.tick(2)
	if !slices.Contains(nw.cmds(f[0]), "x") {
		t.Fatal("with the planted bug the follower should have applied x on a quorum of one durable copy")
	}
	nw.crash(l)
	nw.loseOwn(l)
	nw.crash(f[0])
	nw.heal()
	nw.restart(l)
	nw.elect()
	nw.propose(nw.leader(), "y")
	nw.tick(3)
	x, other := false, false
	for _, e := range nw.applied[f[1]] {
		for _, c := range e.Cmds {
			if string(c) == "x" {
				x = true
			}
		}
	}
	for _, e := range nw.applied[f[0]] {
		for _, o := range nw.applied[f[1]] {
			if o.Slot == e.Slot && !sameValue(&o, &e) {
				other = true
			}
		}
	}
	if x || !other {
		t.Fatalf("the planted bug did not lose the write (x applied on %d: %v, a slot differs: %v)", f[1], x, other)
	}
}

// Own acceptances a leader had not handed out when it stepped down become
// ordinary ones (durable before the next messages): Ready.OwnAccepted holds
// one leadership's entries only.
func TestOwnAcceptedDemotedOnStepDown(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	n := nw.nodes[l]
	b := n.Status().Ballot
	if err := n.Propose([][]byte{[]byte("x")}); err != nil {
		t.Fatal(err)
	}
	if !n.HasReady() { // assigns the slot
		t.Fatal("no Ready after a proposal")
	}
	s := n.Status().LastSlot
	higher := Ballot{Round: b.Round + 1, Node: others(nw, l)[0]}
	if err := n.Step(Message{Type: MsgAccepted, Cluster: n.cfg.ClusterID, From: higher.Node, To: l, Ballot: higher,
		Slot: 1, Index: 1, Reject: true}); err != nil {
		t.Fatal(err)
	}
	if n.Status().Role == RoleLeader {
		t.Fatal("still leading after a rejection with a higher ballot")
	}
	rd := n.Ready()
	if len(rd.OwnAccepted) != 0 {
		t.Fatalf("OwnAccepted after stepping down: %v", rd.OwnAccepted)
	}
	found := false
	for _, e := range rd.Accepted {
		found = found || (e.Slot == s && e.Ballot == b)
	}
	if !found {
		t.Fatalf("slot %d at %v is in neither list: Accepted %v", s, b, rd.Accepted)
	}
	n.Advance(rd)
}

// Reports that do not name a held acceptance change nothing, a bogus range
// costs nothing, and a duplicate counts once.
func TestOwnAcceptedDurableIgnoresStaleReports(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.own.hold(l)
	nw.cut[[2]NodeID{l, others(nw, l)[1]}] = true
	n := nw.nodes[l]
	nw.propose(l, "x")
	s := n.Status().LastSlot
	b := n.Status().Ballot
	n.OwnAcceptedDurable(Ballot{Round: b.Round + 7, Node: l}, s, s)
	n.OwnAcceptedDurable(b, s+1, s+100)
	n.OwnAcceptedDurable(b, 0, 0)
	n.OwnAcceptedDurable(b, 1, slotMax) // walks the table, not the range
	if !ackFrom(n.ackEvents, s, l) {
		t.Fatal("the report covering the slot did not count")
	}
	k := len(n.ackEvents)
	n.OwnAcceptedDurable(b, s, s)
	if len(n.ackEvents) != k {
		t.Fatal("a duplicate report counted again")
	}
	nw.loseOwn(l)
	nw.settle()
	if c := n.Status().Commit; c < s {
		t.Fatalf("commit %d, want %d", c, s)
	}
}

// A stalled persist costs bounded memory: past ownUnstableSlotsMax own
// acceptances not reported durable the leader assigns no new slot.
func TestOwnUnstableBound(t *testing.T) {
	nw := newNetwork(t, 3)
	l := nw.elect()
	nw.own.hold(l)
	n := nw.nodes[l]
	first := n.Status().LastSlot
	for i := range ownUnstableSlotsMax + 10 {
		if err := n.Propose([][]byte{{byte(i)}}); err != nil {
			t.Fatal(err)
		}
		nw.settle()
	}
	if got := n.Status().LastSlot - first; got != ownUnstableSlotsMax {
		t.Fatalf("%d slots assigned with every own write held, want %d", got, ownUnstableSlotsMax)
	}
	nw.persistOwn(l)
	nw.settle()
	// The proposals that waited share one slot.
	if got := len(nw.cmds(l)); got != ownUnstableSlotsMax+10 {
		t.Fatalf("%d commands applied after the writes completed, want %d", got, ownUnstableSlotsMax+10)
	}
	if a := n.Status().Applied; a != n.Status().LastSlot {
		t.Fatalf("applied %d, last %d", a, n.Status().LastSlot)
	}
}

// A single-node group commits only on its own durable vote.
func TestOwnVoteSingleNode(t *testing.T) {
	nw := newNetwork(t, 1)
	l := nw.elect()
	nw.own.hold(l)
	nw.propose(l, "x")
	if slices.Contains(nw.cmds(l), "x") {
		t.Fatal("a one-node group applied a value before it was durable")
	}
	nw.persistOwn(l)
	nw.settle()
	if !slices.Contains(nw.cmds(l), "x") {
		t.Fatal("not applied after the persist")
	}
}

// The leader's window above its commit index stays within
// Config.InflightBytesMax plus one entry, whatever it is asked to
// propose, and fills again as slots commit.
func TestInflightBytesBoundsWindow(t *testing.T) {
	const cmdBytes, boundBytes = 3000, 10000
	nw := newNetworkWith(t, 3, func(c *Config) { c.InflightBytesMax = boundBytes })
	l := nw.elect()
	n := nw.nodes[l]
	// Cut the followers off: nothing commits.
	nw.isolate(l)
	first := n.Status().LastSlot
	for i := range 50 {
		cmd := make([]byte, cmdBytes)
		cmd[0] = byte(i)
		nw.propose(l, string(cmd))
	}
	assigned := n.Status().LastSlot - first
	if n.InflightBytes() < boundBytes || n.InflightBytes() >= boundBytes+cmdBytes+64 {
		t.Fatalf("window holds %d bytes in %d new slots; want it filled to [%d, %d + one entry)", n.InflightBytes(), assigned, boundBytes, boundBytes)
	}
	if assigned > boundBytes/cmdBytes+1 {
		t.Fatalf("%d slots of %d bytes assigned past a %d-byte bound", assigned, cmdBytes, boundBytes)
	}
	nw.heal()
	nw.tick(200)
	if got := len(nw.cmds(l)); got != 50 {
		t.Fatalf("%d of 50 commands applied once the window could drain", got)
	}
	if b := n.InflightBytes(); b != 0 {
		t.Fatalf("%d bytes still counted in flight with everything committed", b)
	}
}

// A leader with Config.PipelineSlotsMax assigns at most that many slots
// above its commit index; proposals made while the window is full wait
// in its queue and share the next slot once it opens, and every one is
// applied. With the default window each proposal gets a slot of its own.
func TestPipelineSlotsBatchQueued(t *testing.T) {
	const window, proposals = 2, 50
	run := func(pipelineSlots int) (assignedWhileCut, slotsUsed Slot) {
		nw := newNetworkWith(t, 3, func(c *Config) { c.PipelineSlotsMax = pipelineSlots })
		l := nw.elect()
		n := nw.nodes[l]
		nw.settle()
		nw.isolate(l) // nothing commits: the window fills
		first := n.Status().LastSlot
		for i := range proposals {
			nw.propose(l, string([]byte{byte(i)}))
		}
		assignedWhileCut = n.Status().LastSlot - first
		nw.heal()
		nw.tick(200)
		if got := len(nw.cmds(l)); got != proposals {
			t.Fatalf("window %d: %d of %d commands applied once the window could drain", pipelineSlots, got, proposals)
		}
		return assignedWhileCut, n.Status().LastSlot - first
	}
	cut, used := run(window)
	if cut != window {
		t.Fatalf("window %d: %d slots assigned while nothing committed", window, cut)
	}
	// The window's slots, then the queued proposals in one slot.
	if used > window+1 {
		t.Fatalf("window %d: %d slots for %d proposals; want the queued ones batched (at most %d)", window, used, proposals, window+1)
	}
	wideCut, wideUsed := run(0)
	if wideCut != proposals || wideUsed != proposals {
		t.Fatalf("default window: %d slots assigned while cut, %d in all, want %d each", wideCut, wideUsed, proposals)
	}
	t.Logf("window=%d: %d slots while cut, %d in all; default: %d, %d", window, cut, used, wideCut, wideUsed)
	if _, err := NewNode(Config{ID: 1, Members: []NodeID{1}, PipelineSlotsMax: inflightSlotsMax + 1}, DurableState{}); err == nil {
		t.Fatal("a window above inflightSlotsMax accepted")
	}
}

// The pipeline window holds back only slots that are not full: commands
// that each fill a slot (SlotBytesMax) get their slots at once, the
// window full or not, so large values keep their pipeline.
func TestPipelineSlotsPassFullSlots(t *testing.T) {
	const window, proposals = 2, 6
	nw := newNetworkWith(t, 3, func(c *Config) { c.PipelineSlotsMax = window })
	l := nw.elect()
	n := nw.nodes[l]
	nw.settle()
	nw.isolate(l)
	first := n.Status().LastSlot
	for i := range proposals {
		cmd := make([]byte, SlotBytesMax)
		cmd[0] = byte(i)
		nw.propose(l, string(cmd))
	}
	if got := n.Status().LastSlot - first; got != proposals {
		t.Fatalf("%d slots assigned for %d full ones with a window of %d, want every one", got, proposals, window)
	}
	// A small command after them waits for the window.
	nw.propose(l, "x")
	if got := n.Status().LastSlot - first; got != proposals {
		t.Fatalf("a partial slot assigned past a full window (%d slots)", got)
	}
	nw.heal()
	nw.tick(200)
	if got := len(nw.cmds(l)); got != proposals+1 {
		t.Fatalf("%d of %d commands applied", got, proposals+1)
	}
}
