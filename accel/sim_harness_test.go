package accel_test

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"synod/accel"
	"synod/paxos"
	"synod/paxos/paxossim"
	"synod/pmem"
)

// This file runs the seeded paxos simulator (paxos/paxossim) with one
// accel.Plane beside every simulated node, driven the way the replica
// runtime drives it (doc.go "Wiring it into the replica runtime" and
// kv/replica/accel*.go), and compares the planes' commit decisions with
// software's:
//
//   - OnStart: a node (re)started, so its plane is new (a crash loses the
//     plane with the process, as in the runtime).
//   - OnReady (after the Ready's durable part, before its messages go
//     out): a durable Promised is written to the promised register; the
//     leader notes every entry of every MsgAccept it sends; the leader's
//     AckEvents go to the checker.
//   - OnOwnDurable (the leader's own acceptances became durable, before
//     software counts them): Arm counts the leader's own ack, so a (slot,
//     ballot) is armed only once it was both sent and durable (as
//     kv/replica's accel_commit.go does), whichever came first, and the
//     Accepteds that arrived for it before are fed to the aggregator right
//     after the Arm. Then, beyond what the runtime does, the leader's plane
//     gets a ghost ack (ghostAcks) for every slot it just armed from every
//     node its member table held and software removed.
//   - OnDeliver (before Step, as the receive loop does): a MsgAccepted
//     goes to OnAcceptedRange (its slots not armed yet wait, see above), a
//     MsgAccept to the follower fast path (OnAccept per entry). The fast
//     path's own Accepted is not sent: the simulator's software Accepted
//     carries the same ack, and the simulator stays the seed's
//     deterministic run.
//   - OnStatus (after the Ready loop, as the consensus loop does): role
//     (a candidate keeps the follower role, as in the runtime), ballot,
//     promised (only upwards), window base = commit+1, and on every
//     membership change the member table (each remaining member keeps its
//     entry: setMembers), self and quorum (doc.go; the simulator changes
//     membership, the runtime's tests do not).
//
// Ghost acks: the protocol itself never makes a removed node ack a slot
// armed after its removal (paxos sends it no Accept, and a leader assigns
// no slot while a membership change is in flight, so a removed node's late
// Accepted only ever names slots that committed before the removal), so
// without them the simulator would never show the aggregator an Accepted
// from a removed node for a live row. An Accepted from a non-member is
// something the plane must not count whatever sent it (a stale node, a
// misdirected or replayed packet); software ignores it (the sender is not
// a peer), so it goes to the plane only, and its hand-ups are kept from
// the checker: a handed-up Accepted excuses a software-only commit of its
// slot, and these say nothing about the real acks.
//
// Verdicts (simCheck, per plane incarnation): the runtime's rules
// (kv/replica/accel_check.go): a slot whose committed ballots differ
// mismatches, except that a software-only commit is excused when the plane
// handed up an Arm or Accepted for the slot, and a plane-only commit is
// excused when software stopped leading at that ballot before it decided
// (simCheck.result says exactly when). On top, the simulator knows the
// truth: every plane commit of (slot, ballot) must name the value the
// system finally chose at slot (the value the leader proposed at that
// ballot, which the runtime's early apply path would apply). A plane
// commit of any other value is a mismatch, excused or not. And the
// simulator knows when: it hands a node one input (a message, a tick, a
// proposal), and the plane's inputs from it, and drains the node's Ready
// rounds before OnStatus, so software that is still leading at b at that
// OnStatus has counted every ack the plane counted for the input; a plane
// commit of (slot, b) that software has not made by then is a commit
// software never made on those acks: a mismatch, excused or not (the
// prompt rule, simCheck.prompt). Early commits are what the runtime's
// early apply path would act on, and the end-of-incarnation rules cannot
// see them once software commits the same (slot, ballot) later.

// simWindowSlots is the aggregator window of the simulated planes: the
// runtime's 1024 (accelWindowSlots) on most seeds, and a small one on
// every fourth seed so that out-of-window hand-ups happen too.
const (
	simWindowSlots      = 1024
	simWindowSlotsSmall = 8
	simReplicasMax      = 8 // the simulator runs at most 5 genesis nodes plus one fresh one
)

type slotBallotKey struct {
	slot   paxos.Slot
	ballot paxos.Ballot
}

// simPlane is one node incarnation's plane and the registers last written.
type simPlane struct {
	id       paxos.NodeID
	p        *accel.Plane
	trace    *bytes.Buffer // nil unless tracing
	chk      *simCheck
	buf      []accel.Event
	role     accel.Role
	ballot   paxos.Ballot
	promised paxos.Ballot
	base     paxos.Slot
	members  []paxos.NodeID
	table    [simReplicasMax]paxos.NodeID // the member table as written
	commit   paxos.Slot
	crashed  bool // this incarnation ended by a crash
	// gone lists the nodes this plane's member table held and software
	// removed since (not added back): the senders of its ghost acks.
	gone []paxos.NodeID
	// pending holds the plane's commits since the node's last OnStatus,
	// for the prompt rule.
	pending  []slotBallotKey
	armedNow []slotBallotKey // scratch: what one input armed
	// rows are the leader's (slot, ballot)s not armed yet: sent, durable,
	// and the senders of Accepteds that arrived before the Arm.
	rows      map[slotBallotKey]*armRow
	armedKeys map[slotBallotKey]bool
}

// armRow is a (slot, ballot) on its way to the aggregator.
type armRow struct {
	sent, durable bool
	early         []paxos.NodeID
}

// simHarness holds the planes of one simulator run.
type simHarness struct {
	spec        accel.Spec
	plantQuorum bool // planted bug: every plane's quorum register one too low
	tracing     bool

	cur   map[paxos.NodeID]*simPlane
	incs  []*simPlane
	armed map[slotBallotKey]string // the value the leader proposed at (slot, ballot)
	// chosen is the value applied at each slot (the simulator checks that
	// every replica applies the same one).
	chosen map[paxos.Slot]string
	fast   uint64
	ghosts uint64 // ghost acks fed (one per slot and sender)
}

func newSimHarness(seed uint64, plantQuorum, tracing bool) *simHarness {
	spec := accel.DefaultSpec()
	spec.WindowSlots = simWindowSlots
	if seed%4 == 0 {
		spec.WindowSlots = simWindowSlotsSmall
	}
	spec.Replicas, spec.Quorum = simReplicasMax, 1
	spec.TenantsMax = 0
	spec.Seed = uint32(seed) | 1
	return &simHarness{spec: spec, plantQuorum: plantQuorum, tracing: tracing,
		cur: map[paxos.NodeID]*simPlane{}, armed: map[slotBallotKey]string{}, chosen: map[paxos.Slot]string{}}
}

func (h *simHarness) options() paxossim.Options {
	return paxossim.Options{OnStart: h.start, OnReady: h.ready, OnDeliver: h.deliver, OnStatus: h.status, OnOwnDurable: h.ownDurable}
}

// nullWAL is the fast path's log: durable at once, keeps nothing (the
// simulator's own durable store is software's).
type nullWAL struct{}

func (nullWAL) Append([]pmem.Record) error    { return nil }
func (nullWAL) Persist() error                { return nil }
func (nullWAL) SetPromised(pmem.Ballot) error { return nil }

func (h *simHarness) start(id paxos.NodeID) {
	if old := h.cur[id]; old != nil {
		old.crashed = true // a restart follows a crash
	}
	sp := &simPlane{id: id, chk: newSimCheck(), rows: map[slotBallotKey]*armRow{}}
	opts := []accel.Option{accel.WithWAL(nullWAL{})}
	if h.tracing {
		sp.trace = &bytes.Buffer{}
		opts = append(opts, accel.WithTrace(sp.trace))
	}
	p, err := accel.New(h.spec, opts...)
	if err != nil {
		panic(err) // the spec is a constant of this file
	}
	sp.p = p
	h.cur[id] = sp
	h.incs = append(h.incs, sp)
}

func (sp *simPlane) flush() {
	if len(sp.buf) > 0 {
		sp.chk.plane(sp.buf)
		for _, e := range sp.buf {
			if e.Kind == accel.OutCommit {
				sp.pending = append(sp.pending, slotBallotKey{e.Slot, e.Ballot})
			}
		}
		sp.buf = sp.buf[:0]
	}
}

// entryValue is what makes two proposals the same value: type and commands
// (not the slot or the ballot it was accepted under).
func entryValue(e *paxos.Entry) string {
	b := []byte{byte(e.Type)}
	for _, c := range e.Cmds {
		b = binary.AppendUvarint(b, uint64(len(c)))
		b = append(b, c...)
	}
	return string(b)
}

func (h *simHarness) ready(id paxos.NodeID, rd *paxos.Ready) {
	sp := h.cur[id]
	if rd.Promised != nil && sp.promised.Less(*rd.Promised) {
		// The promise is durable now and its messages are not sent yet.
		sp.buf = sp.p.SetPromised(sp.buf, *rd.Promised)
		sp.promised = *rd.Promised
	}
	sp.armedNow = sp.armedNow[:0]
	for i := range rd.Messages {
		m := &rd.Messages[i]
		if m.Type != paxos.MsgAccept || m.Reject || m.From != id {
			continue
		}
		for j := range m.Entries {
			e := &m.Entries[j]
			k := slotBallotKey{e.Slot, m.Ballot}
			h.armed[k] = entryValue(e)
			if r := sp.row(k); r != nil {
				r.sent = true
				sp.maybeArm(k, r)
			}
		}
	}
	sp.flush()
	h.ghostAcks(sp)
	sp.chk.software(rd.AckEvents)
	for i := range rd.Committed {
		e := &rd.Committed[i]
		if _, ok := h.chosen[e.Slot]; !ok {
			h.chosen[e.Slot] = entryValue(e)
		}
	}
}

func (h *simHarness) deliver(m *paxos.Message) {
	sp := h.cur[m.To]
	if sp == nil {
		return
	}
	switch {
	case m.Type == paxos.MsgAccepted && !m.Reject:
		sp.accepted(m)
	case m.Type == paxos.MsgAccept && !m.Reject:
		for i := range m.Entries {
			n := len(sp.buf)
			sp.buf = sp.p.OnAccept(sp.buf, m.Entries[i].Slot, m.Ballot, m.From, paxos.AppendEntry(nil, &m.Entries[i]))
			for _, ev := range sp.buf[n:] {
				if ev.Kind == accel.OutSendAccepted {
					h.fast++
				}
			}
		}
	}
	sp.flush()
}

// ownDurable arms what sp's node sent and has now made durable.
func (h *simHarness) ownDurable(id paxos.NodeID, b paxos.Ballot, first, last paxos.Slot) {
	sp := h.cur[id]
	sp.armedNow = sp.armedNow[:0]
	for s := first; s <= last; s++ {
		k := slotBallotKey{s, b}
		if r := sp.row(k); r != nil {
			r.durable = true
			sp.maybeArm(k, r)
		}
	}
	sp.flush()
	h.ghostAcks(sp)
}

// row is k's row, created on first use; nil once k was armed (armed keys
// are remembered in armedKeys so a late report does not arm twice).
func (sp *simPlane) row(k slotBallotKey) *armRow {
	if sp.armedKeys[k] {
		return nil
	}
	r := sp.rows[k]
	if r == nil {
		r = &armRow{}
		sp.rows[k] = r
	}
	return r
}

// maybeArm arms k once it was sent and is durable, then feeds the
// Accepteds that came for it before.
func (sp *simPlane) maybeArm(k slotBallotKey, r *armRow) {
	if !r.sent || !r.durable {
		return
	}
	sp.buf = sp.p.Arm(sp.buf, k.slot, k.ballot)
	for _, from := range r.early {
		sp.buf = sp.p.OnAccepted(sp.buf, k.slot, k.ballot, from)
	}
	delete(sp.rows, k)
	if sp.armedKeys == nil {
		sp.armedKeys = map[slotBallotKey]bool{}
	}
	sp.armedKeys[k] = true
	if len(sp.gone) > 0 {
		sp.armedNow = append(sp.armedNow, k)
	}
}

// accepted feeds one MsgAccepted to the aggregator: the acks of (slot,
// ballot)s this leader sent and has not armed yet wait in their rows, the
// rest go in runs to OnAcceptedRange.
func (sp *simPlane) accepted(m *paxos.Message) {
	last := max(m.Index, m.Slot)
	run := m.Slot
	for s := m.Slot; s <= last && s >= m.Slot; s++ {
		k := slotBallotKey{s, m.Ballot}
		r := sp.rows[k]
		if r == nil || !r.sent {
			continue
		}
		if run < s {
			sp.buf = sp.p.OnAcceptedRange(sp.buf, run, s-1, m.Ballot, m.From)
		}
		run = s + 1
		if !slices.Contains(r.early, m.From) {
			r.early = append(r.early, m.From)
		}
	}
	if run <= last {
		sp.buf = sp.p.OnAcceptedRange(sp.buf, run, last, m.Ballot, m.From)
	}
}

// ghostAcks feeds the leader's plane an Accepted for every slot the Ready
// just armed from every node in sp.gone (the file comment says why). Only
// the commits they cause reach the checker (a correct plane makes none).
func (h *simHarness) ghostAcks(sp *simPlane) {
	if len(sp.armedNow) == 0 {
		return
	}
	// The leader sends each entry to every peer: arm once, ack once.
	slices.SortFunc(sp.armedNow, func(a, b slotBallotKey) int { return cmp.Compare(a.slot, b.slot) })
	sp.armedNow = slices.Compact(sp.armedNow)
	for _, from := range sp.gone {
		for _, k := range sp.armedNow {
			n := len(sp.buf)
			sp.buf = sp.p.OnAccepted(sp.buf, k.slot, k.ballot, from)
			h.ghosts++
			kept := n
			for _, e := range sp.buf[n:] {
				if e.Kind == accel.OutCommit {
					sp.buf[kept] = e
					kept++
				}
			}
			sp.buf = sp.buf[:kept]
		}
	}
	sp.flush()
}

func (h *simHarness) status(id paxos.NodeID, st *paxos.Status) {
	sp := h.cur[id]
	// The prompt rule: software has handled the input whose plane
	// inputs made these commits (and drained its Ready rounds).
	for _, k := range sp.pending {
		if st.Role == paxos.RoleLeader && st.Ballot == k.ballot {
			sp.chk.prompt(k.slot, k.ballot)
		}
	}
	sp.pending = sp.pending[:0]
	sp.commit = st.Commit
	if !slices.Equal(st.Members, sp.members) {
		sp.setMembers(st.Members, h.plantQuorum)
	}
	role := accel.RoleOff
	switch st.Role {
	case paxos.RoleLeader:
		role = accel.RoleLeader
	case paxos.RoleFollower, paxos.RoleCandidate:
		role = accel.RoleFollower
	}
	if role != sp.role {
		sp.buf = sp.p.SetRole(sp.buf, role)
		sp.role = role
	}
	if st.Ballot != sp.ballot {
		sp.buf = sp.p.SetBallot(sp.buf, st.Ballot)
		sp.ballot = st.Ballot
	}
	if sp.promised.Less(st.Promised) {
		sp.buf = sp.p.SetPromised(sp.buf, st.Promised)
		sp.promised = st.Promised
	}
	if base := st.Commit + 1; base != sp.base {
		sp.buf = sp.p.SetWindowBase(sp.buf, base)
		sp.base = base
	}
	sp.flush()
}

// simVerdict sums the verdicts of one or more runs.
type simVerdict struct {
	accel.CheckResult
	WrongValue int // plane commits of a value other than the chosen one
	Unknown    int // plane commits of a slot no replica applied (not judged by value)
	Fast       uint64
	Ghosts     uint64 // ghost acks fed to the planes
	Incs       int
	Traces     []traceOf // the planes' traces, when tracing
}

type traceOf struct {
	node paxos.NodeID
	data []byte
}

func (v *simVerdict) add(o simVerdict) {
	v.Commits += o.Commits
	v.Mismatches += o.Mismatches
	v.HandUps += o.HandUps
	v.Excused += o.Excused
	if v.First == "" {
		v.First = o.First
	}
	v.WrongValue += o.WrongValue
	v.Unknown += o.Unknown
	v.Fast += o.Fast
	v.Ghosts += o.Ghosts
	v.Incs += o.Incs
}

// verdict judges every incarnation of the run.
func (h *simHarness) verdict() simVerdict {
	var v simVerdict
	v.Fast = h.fast
	v.Ghosts = h.ghosts
	for _, sp := range h.incs {
		if err := sp.p.Close(); err != nil {
			panic(err) // a bytes.Buffer does not fail
		}
		for k, r := range sp.rows {
			if len(r.early) > 0 {
				sp.chk.withheld(k.slot, k.ballot)
			}
		}
		r := sp.chk.result(func(s paxos.Slot, b paxos.Ballot) string {
			c, ok := h.chosen[s]
			if !ok {
				v.Unknown++
				return ""
			}
			if a := h.armed[slotBallotKey{s, b}]; a != c {
				v.WrongValue++
				return fmt.Sprintf("node %d: plane committed slot %d at ballot %v, whose value is not the one chosen", sp.id, s, b)
			}
			return ""
		}, sp.leadingAt(), sp.crashed)
		v.CheckResult.Commits += r.Commits
		v.Mismatches += r.Mismatches
		v.HandUps += r.HandUps
		v.Excused += r.Excused
		if v.First == "" && r.First != "" {
			v.First = fmt.Sprintf("node %d: %s", sp.id, r.First)
		}
		v.Incs++
		if sp.trace != nil {
			v.Traces = append(v.Traces, traceOf{sp.id, sp.trace.Bytes()})
		}
	}
	return v
}

// setMembers rewrites the member table for a new membership, keeping every
// remaining member at its entry: the aggregator's ack masks are indexed by
// entry, so moving a member to another entry would drop or misattribute
// the acks already counted for slots in flight (a compacted rewrite loses
// the leader's own ack when it moves down, and the slot never commits in
// the plane). A removed member's entry is cleared; a new one takes the
// first free entry.
func (sp *simPlane) setMembers(members []paxos.NodeID, plantQuorum bool) {
	for i, m := range sp.table {
		if m != 0 && !slices.Contains(members, m) {
			sp.table[i] = 0
			sp.buf = sp.p.SetMember(sp.buf, i, 0)
			sp.gone = append(sp.gone, m)
		}
	}
	for _, m := range members {
		if slices.Contains(sp.table[:], m) {
			continue
		}
		sp.gone = slices.DeleteFunc(sp.gone, func(g paxos.NodeID) bool { return g == m })
		if i := slices.Index(sp.table[:], 0); i >= 0 {
			sp.table[i] = m
			sp.buf = sp.p.SetMember(sp.buf, i, m)
		}
	}
	// A node outside the membership (removed) keeps its old self entry,
	// now cleared: its own acks no longer count.
	if self := slices.Index(sp.table[:], sp.id); self >= 0 {
		sp.buf = sp.p.SetSelf(sp.buf, self)
	}
	q := len(members)/2 + 1
	if plantQuorum {
		q = max(q-1, 1)
	}
	sp.buf = sp.p.SetQuorum(sp.buf, q)
	sp.members = slices.Clone(members)
}

// leadingAt is the ballot the incarnation leads with as its registers last
// said (zero when not leading).
func (sp *simPlane) leadingAt() paxos.Ballot {
	if sp.role != accel.RoleLeader {
		return paxos.Ballot{}
	}
	return sp.ballot
}
