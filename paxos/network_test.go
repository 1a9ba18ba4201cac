package paxos

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
)

// network is a synchronous in-memory group in the style of etcd raft's test
// network: messages are delivered in order unless cut, dropped or the
// receiver is isolated or down. Each node's durable state is kept the way
// the Ready contract says, so a node can be restarted from it.
type network struct {
	t       testing.TB
	cfg     Config
	ids     []NodeID
	nodes   map[NodeID]*Node
	durable map[NodeID]*durable
	applied map[NodeID][]Entry
	snaps   map[NodeID]*testSnap // the snapshot each node installed last
	// staged holds the state a node fetched after an offer and staged for
	// InstallSnapshot (the next Ready's Snapshot names it).
	staged map[NodeID]*testSnap
	// offers is the last snapshot offer each node's Ready carried; with
	// noFetch the harness does not fetch it (the test does).
	offers  map[NodeID]*SnapshotOffer
	noFetch bool
	cut     map[[2]NodeID]bool // from -> to dropped
	down    map[NodeID]bool
	// dropNext drops messages for which it returns true (nil: none).
	dropNext func(m Message) bool
	queue    []Message
	reads    map[NodeID][]ReadState
	acks     map[NodeID][]AckEvent
	sent     int
	// stored counts the entries each node's Readys gave to persist
	// (Accepted and OwnAccepted), retransmits of held ones excluded.
	stored map[NodeID]int
	// reballots counts the stored entries that were re-ballots (Held:
	// reballot.go); store checks each names the record it replaces.
	reballots map[NodeID]int
	// own holds the leaders' own acceptances whose persist has not
	// completed, for the nodes a test holds them on (ownvote_test.go).
	own ownPersists
}

// testSnap is an application snapshot of the test network: opaque data and
// its metadata.
type testSnap struct {
	Meta SnapshotMeta
	Data []byte
}

type durable struct {
	promised Ballot
	accepted map[Slot]Entry
	applied  Slot
	chosen   Slot // what the application recorded chosen (DurableState.Chosen)
	snap     *SnapshotMeta
	snapData []byte // the application's snapshot, which it serves to laggards
}

func (d *durable) state() DurableState {
	st := DurableState{Promised: d.promised, Applied: d.applied, Chosen: d.chosen, Snapshot: d.snap}
	for _, s := range slices.Sorted(maps.Keys(d.accepted)) {
		if d.snap != nil && s <= d.snap.Slot {
			continue
		}
		st.Accepted = append(st.Accepted, d.accepted[s])
	}
	return st
}

func testConfig(id NodeID, members []NodeID) Config {
	return Config{ID: id, ClusterID: 7, Members: members, ElectionTicks: 10, HeartbeatTicks: 1,
		LeaseTicks: 8, DriftTicks: 1, Seed: 1}
}

func newNetwork(t testing.TB, size int) *network {
	ids := make([]NodeID, size)
	for i := range ids {
		ids[i] = NodeID(i + 1)
	}
	nw := &network{t: t, ids: ids, nodes: map[NodeID]*Node{}, durable: map[NodeID]*durable{},
		applied: map[NodeID][]Entry{}, snaps: map[NodeID]*testSnap{}, staged: map[NodeID]*testSnap{}, offers: map[NodeID]*SnapshotOffer{}, cut: map[[2]NodeID]bool{}, down: map[NodeID]bool{},
		reads: map[NodeID][]ReadState{}, acks: map[NodeID][]AckEvent{}, stored: map[NodeID]int{}}
	for _, id := range ids {
		nw.start(id, testConfig(id, ids))
	}
	return nw
}

// newNetworkWith is newNetwork with every node's config passed through
// edit first.
func newNetworkWith(t testing.TB, size int, edit func(*Config)) *network {
	nw := newNetwork(t, size)
	for _, id := range nw.ids {
		cfg := testConfig(id, nw.ids)
		edit(&cfg)
		nw.start(id, cfg)
	}
	return nw
}

func (nw *network) start(id NodeID, cfg Config) {
	nw.t.Helper()
	d := nw.durable[id]
	if d == nil {
		d = &durable{accepted: map[Slot]Entry{}}
		nw.durable[id] = d
		if !slices.Contains(nw.ids, id) {
			nw.ids = append(nw.ids, id)
		}
	}
	n, err := NewNode(cfg, d.state())
	if err != nil {
		nw.t.Fatalf("NewNode %d: %v", id, err)
	}
	nw.nodes[id] = n
	delete(nw.down, id)
}

// compact takes an application snapshot on id through its applied slot and
// keeps it with the durable state, as an application would.
func (nw *network) compact(id NodeID, data []byte) error {
	return nw.compactAt(id, nw.nodes[id].applied, data)
}

// compactAt compacts id through slot with data as its application
// snapshot.
func (nw *network) compactAt(id NodeID, slot Slot, data []byte) error {
	n := nw.nodes[id]
	if err := n.Compact(slot); err != nil {
		return err
	}
	meta := *n.snap
	nw.durable[id].snap = &meta
	nw.durable[id].snapData = data
	return nil
}

// fetch serves an offer as a runtime would: the offering node's
// application snapshot, stamped with the metadata its node gives for that
// slot, staged on id and handed to InstallSnapshot (after id's Advance).
func (nw *network) fetch(id NodeID, offer *SnapshotOffer) {
	src := nw.durable[offer.From]
	if nw.down[offer.From] || src == nil {
		return // the transfer fails; the offer comes again
	}
	if from := nw.nodes[offer.From]; (src.snap == nil || src.snap.Slot < offer.Meta.Slot) && from.applied >= offer.Meta.Slot && from.applied > 0 {
		// The application serves its current state (kv/replica does):
		// the offer of a stuck catch-up names it (catchup_stuck.go).
		if err := nw.compact(offer.From, []byte(fmt.Sprintf("snap%d", from.applied))); err != nil {
			nw.t.Fatalf("node %d: snapshot to serve an offer at %d: %v", offer.From, offer.Meta.Slot, err)
		}
	}
	if src.snap == nil {
		return // the transfer fails; the offer comes again
	}
	meta, err := nw.nodes[offer.From].SnapshotMetaAt(src.snap.Slot)
	if err != nil {
		nw.t.Fatalf("node %d: offered slot %d but has no metadata for its snapshot at %d: %v", offer.From, offer.Meta.Slot, src.snap.Slot, err)
	}
	if meta.Slot < offer.Meta.Slot {
		nw.t.Fatalf("node %d: offered slot %d but holds a snapshot at %d", offer.From, offer.Meta.Slot, meta.Slot)
	}
	if err := nw.nodes[id].InstallSnapshot(meta); err == nil {
		nw.staged[id] = &testSnap{Meta: meta, Data: src.snapData}
	} else if !errors.Is(err, ErrSnapshotStale) {
		nw.t.Fatalf("node %d: InstallSnapshot(%+v): %v", id, meta, err)
	}
}

// crash stops id; restart brings it back from its durable state only.
func (nw *network) crash(id NodeID) { nw.down[id] = true }

func (nw *network) restart(id NodeID) {
	nw.start(id, nw.nodes[id].cfg)
}

func (nw *network) isolate(id NodeID) {
	for _, o := range nw.ids {
		if o != id {
			nw.cut[[2]NodeID{id, o}] = true
			nw.cut[[2]NodeID{o, id}] = true
		}
	}
}

func (nw *network) heal() { nw.cut = map[[2]NodeID]bool{} }

// store makes e durable on id. A re-ballot (Held) must name the entry
// stored at its slot, with the same value, as a runtime's log needs it to.
func (nw *network) store(id NodeID, e Entry) {
	d := nw.durable[id]
	if !e.Held.IsZero() {
		base, ok := d.accepted[e.Slot]
		if !ok || base.Ballot != e.Held || !sameValue(&base, &e) {
			nw.t.Fatalf("node %d: re-ballot of slot %d under %v names %v; stored: %v %+v", id, e.Slot, e.Ballot, e.Held, ok, base)
		}
		if nw.reballots == nil {
			nw.reballots = map[NodeID]int{}
		}
		nw.reballots[id]++
		e.Held = Ballot{}
	}
	d.accepted[e.Slot] = e
}

// handleReady processes one node's Ready by the contract.
func (nw *network) handleReady(id NodeID) bool {
	n := nw.nodes[id]
	if nw.down[id] || !n.HasReady() {
		return false
	}
	nw.readyDone(id, n.Ready())
	return true
}

// readyDone handles rd, id's Ready, by the contract, then Advances.
func (nw *network) readyDone(id NodeID, rd Ready) {
	n := nw.nodes[id]
	d := nw.durable[id]
	if rd.Promised != nil {
		if rd.Promised.Less(d.promised) {
			nw.t.Fatalf("node %d: promised went down from %v to %v", id, d.promised, *rd.Promised)
		}
		d.promised = *rd.Promised
	}
	for _, e := range rd.Accepted {
		nw.store(id, e)
	}
	nw.stored[id] += len(rd.Accepted) + len(rd.OwnAccepted)
	for _, m := range rd.Messages {
		nw.sent++
		nw.queue = append(nw.queue, m)
	}
	if rd.Snapshot != nil {
		st := nw.staged[id]
		if st == nil || st.Meta.Slot != rd.Snapshot.Slot {
			nw.t.Fatalf("node %d: Ready names snapshot %+v, staged %+v", id, *rd.Snapshot, st)
		}
		delete(nw.staged, id)
		nw.snaps[id] = st
		meta := st.Meta
		d.snap = &meta
		d.snapData = st.Data
		d.applied = meta.Slot
		// The application state is the snapshot: its history is opaque.
		nw.applied[id] = append(nw.applied[id][:0:0], Entry{Slot: meta.Slot, Type: EntryNoop, Cmds: [][]byte{st.Data}})
	}
	for _, e := range rd.Committed {
		if e.Slot != d.applied+1 {
			nw.t.Fatalf("node %d: applied slot %d after %d", id, e.Slot, d.applied)
		}
		d.applied = e.Slot
		nw.applied[id] = append(nw.applied[id], e)
	}
	nw.reads[id] = append(nw.reads[id], rd.ReadStates...)
	nw.acks[id] = append(nw.acks[id], rd.AckEvents...)
	n.Advance(rd)
	nw.ownAccepted(id, rd.OwnAccepted)
	if rd.SnapshotOffer != nil {
		o := *rd.SnapshotOffer
		nw.offers[id] = &o
		if !nw.noFetch {
			nw.fetch(id, &o)
		}
	}
}

// settle runs Ready/deliver rounds until nothing moves.
func (nw *network) settle() {
	nw.t.Helper()
	for range 10000 {
		moved := false
		for _, id := range nw.ids {
			if nw.handleReady(id) {
				moved = true
			}
		}
		q := nw.queue
		nw.queue = nil
		for _, m := range q {
			moved = true
			if nw.down[m.To] || nw.cut[[2]NodeID{m.From, m.To}] || (nw.dropNext != nil && nw.dropNext(m)) {
				continue
			}
			// Round-trip every message through the codec.
			b := AppendMessage(nil, &m)
			m2, err := UnmarshalMessage(b)
			if err != nil {
				nw.t.Fatalf("codec: %v", err)
			}
			if n := nw.nodes[m.To]; n != nil {
				if err := n.Step(m2); err != nil {
					nw.t.Fatalf("node %d step %v: %v", m.To, m.Type, err)
				}
			}
		}
		if !moved {
			return
		}
	}
	nw.t.Fatal("network did not settle")
}

// tick ticks every live node k times, settling after each.
func (nw *network) tick(k int) {
	nw.t.Helper()
	for range k {
		for _, id := range nw.ids {
			if !nw.down[id] {
				nw.nodes[id].Tick()
			}
		}
		nw.settle()
	}
}

// leader returns the node that is leader and reachable by a majority view,
// or 0. When several think they lead, the highest ballot wins.
func (nw *network) leader() NodeID {
	var best NodeID
	var bb Ballot
	for _, id := range nw.ids {
		if nw.down[id] {
			continue
		}
		st := nw.nodes[id].Status()
		if st.Role == RoleLeader && (best == 0 || bb.Less(st.Ballot)) {
			best, bb = id, st.Ballot
		}
	}
	return best
}

// elect ticks until some node leads and its first noop committed.
func (nw *network) elect() NodeID {
	nw.t.Helper()
	for range 200 {
		nw.tick(1)
		if l := nw.leader(); l != 0 && nw.nodes[l].ownCommitted() {
			return l
		}
	}
	nw.t.Fatal("no leader elected")
	return 0
}

func (nw *network) propose(id NodeID, cmds ...string) {
	nw.t.Helper()
	bs := make([][]byte, len(cmds))
	for i, c := range cmds {
		bs[i] = []byte(c)
	}
	if err := nw.nodes[id].Propose(bs); err != nil {
		nw.t.Fatalf("propose on %d: %v", id, err)
	}
	nw.settle()
}

// cmds lists the normal commands node id applied, in order.
func (nw *network) cmds(id NodeID) []string {
	var out []string
	for _, e := range nw.applied[id] {
		if e.Type == EntryNormal {
			for _, c := range e.Cmds {
				out = append(out, string(c))
			}
		}
	}
	return out
}

// checkAgree asserts that all live nodes applied the same slots identically
// where they overlap.
func (nw *network) checkAgree() {
	nw.t.Helper()
	bySlot := map[Slot]string{}
	for _, id := range nw.ids {
		for _, e := range nw.applied[id] {
			v := fmt.Sprintf("%d/%q", e.Type, e.Cmds)
			if e.Type == EntryNoop && len(e.Cmds) == 1 {
				continue // a snapshot marker
			}
			if o, ok := bySlot[e.Slot]; ok && o != v {
				nw.t.Fatalf("slot %d: node %d applied %s, another applied %s", e.Slot, id, v, o)
			}
			bySlot[e.Slot] = v
		}
	}
}
