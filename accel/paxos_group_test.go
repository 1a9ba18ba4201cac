package accel

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"synod/paxos"
)

// This file runs real paxos nodes with a plane beside each, wired the way
// the replica runtime is meant to wire them (see doc.go), and checks that
// the plane's commit decisions match software's (mismatches=0).

type groupMsg struct {
	m   paxos.Message
	due int
}

type group struct {
	t       *testing.T
	rng     *rand.Rand
	ids     []paxos.NodeID
	nodes   []*paxos.Node
	planes  []*Plane
	traces  []*bytes.Buffer
	queue   []groupMsg
	cut     map[[2]paxos.NodeID]bool
	chk     *Checker
	now     int
	applied []paxos.Slot
	hbOut   []Event
	dropPct int
	planeQ  int // planted bug: the planes' quorum register (0: correct)
}

const groupTickPlaneTicks = 1000 // one paxos tick is 1 ms of plane time

func newGroup(t *testing.T, seed int64, size int, trace bool) *group {
	g := &group{t: t, rng: rand.New(rand.NewSource(seed)), cut: map[[2]paxos.NodeID]bool{}, chk: NewChecker(), dropPct: 3}
	for i := 0; i < size; i++ {
		g.ids = append(g.ids, paxos.NodeID(i+1))
	}
	spec := DefaultSpec()
	spec.Replicas, spec.Quorum = size, size/2+1
	spec.WindowSlots = 256
	spec.HeartbeatPeriodTicks, spec.LeaseTicks, spec.LeaseDriftTicks = 2_000, 8_000, 1_000
	spec.ElectionTicks, spec.ElectionJitterTicks = 10_000, 8_192
	for i, id := range g.ids {
		n, err := paxos.NewNode(paxos.Config{ID: id, ClusterID: 9, Members: g.ids, ElectionTicks: 10, HeartbeatTicks: 1,
			LeaseTicks: 8, DriftTicks: 1, Seed: seed*10 + int64(i)}, paxos.DurableState{})
		if err != nil {
			t.Fatal(err)
		}
		opts := []Option{WithWAL(&fakeWAL{})}
		var buf *bytes.Buffer
		if trace {
			buf = &bytes.Buffer{}
			opts = append(opts, WithTrace(buf))
		}
		spec.Seed = uint32(seed*10) + uint32(i)
		p, err := New(spec, opts...)
		if err != nil {
			t.Fatal(err)
		}
		for j, m := range g.ids {
			p.SetMember(nil, j, m)
		}
		p.SetSelf(nil, i)
		g.nodes, g.planes, g.traces = append(g.nodes, n), append(g.planes, p), append(g.traces, buf)
		g.applied = append(g.applied, 0)
	}
	return g
}

// syncRegisters writes software's view into the plane's registers, as the
// runtime does after every Ready (and here also after every Step, so that
// a leader that stepped down stops counting at once).
func (g *group) syncRegisters(i int) {
	st, p := g.nodes[i].Status(), g.planes[i]
	role := RoleOff
	switch st.Role {
	case paxos.RoleLeader:
		role = RoleLeader
	case paxos.RoleFollower:
		role = RoleFollower
	}
	if role == RoleLeader {
		g.chk.Plane(p.SetBallot(nil, st.Ballot))
	}
	g.chk.Plane(p.SetPromised(nil, st.Promised))
	g.chk.Plane(p.SetWindowBase(nil, st.Commit+1))
	if q := g.planeQ; q != 0 {
		p.SetQuorum(nil, q)
	}
	g.chk.Plane(p.SetRole(nil, role))
}

func (g *group) handleReady(i int) {
	n := g.nodes[i]
	for n.HasReady() {
		rd := n.Ready()
		g.syncRegisters(i)
		// Ready contract step 1 (persist) is a no-op in memory, and so is
		// the leader's own write (rd.OwnAccepted), done at once here: the
		// leader arms the aggregator for every Accept it sends, once its
		// own acceptance is durable — which it now is.
		for _, m := range rd.Messages {
			if m.Type == paxos.MsgAccept && m.From == g.ids[i] {
				for _, e := range m.Entries {
					g.chk.Plane(g.planes[i].Arm(nil, e.Slot, m.Ballot))
				}
			}
			g.send(m)
		}
		g.chk.Software(rd.AckEvents)
		for _, e := range rd.Committed {
			g.applied[i] = e.Slot
		}
		n.Advance(rd)
		if k := len(rd.OwnAccepted); k > 0 {
			n.OwnAcceptedDurable(rd.OwnAccepted[0].Ballot, rd.OwnAccepted[0].Slot, rd.OwnAccepted[k-1].Slot)
		}
		g.syncRegisters(i)
	}
}

func (g *group) send(m paxos.Message) {
	if g.cut[[2]paxos.NodeID{m.From, m.To}] || g.rng.Intn(100) < g.dropPct {
		return
	}
	g.queue = append(g.queue, groupMsg{m, g.now + 1 + g.rng.Intn(3)})
	if g.rng.Intn(100) < 2 {
		g.queue = append(g.queue, groupMsg{m, g.now + 1 + g.rng.Intn(5)}) // duplicate
	}
}

func (g *group) index(id paxos.NodeID) int { return int(id) - 1 }

func (g *group) deliver(m paxos.Message) {
	j := g.index(m.To)
	p := g.planes[j]
	switch {
	case m.Type == paxos.MsgAccepted && !m.Reject:
		// The receive loop feeds the aggregator before software sees it.
		for s := m.Slot; s <= m.Index; s++ {
			g.chk.Plane(p.OnAccepted(nil, s, m.Ballot, m.From))
		}
	case m.Type == paxos.MsgAccept:
		// The follower fast path (its SendAccepted is not sent here: the
		// software Accepted below is, so the two paths are compared on
		// the same traffic). Payload: the entry as software encodes it.
		for k := range m.Entries {
			p.OnAccept(nil, m.Entries[k].Slot, m.Ballot, m.From, paxos.AppendEntry(nil, &m.Entries[k]))
		}
	}
	_ = g.nodes[j].Step(m)
	g.syncRegisters(j)
	g.handleReady(j)
}

// tickPlanes runs every plane's timer engine and delivers plane heartbeats
// and acks directly between planes (honouring the cuts).
func (g *group) tickPlanes() {
	now := uint64(g.now) * groupTickPlaneTicks
	for i, p := range g.planes {
		g.hbOut = p.Tick(g.hbOut[:0], now)
		for _, e := range g.hbOut {
			if e.Kind != OutHeartbeat {
				continue
			}
			for j, f := range g.planes {
				if j == i || g.cut[[2]paxos.NodeID{g.ids[i], g.ids[j]}] {
					continue
				}
				for _, a := range f.OnHeartbeat(nil, g.ids[i], e.Ballot, e.Value) {
					if a.Kind == OutHeartbeatAck && !g.cut[[2]paxos.NodeID{g.ids[j], g.ids[i]}] {
						p.OnHeartbeatAck(nil, g.ids[j], a.Ballot, a.Value)
					}
				}
			}
		}
	}
}

func (g *group) leader() int {
	for i, n := range g.nodes {
		if n.Status().Role == paxos.RoleLeader {
			return i
		}
	}
	return -1
}

func (g *group) isolate(i int) {
	for _, o := range g.ids {
		if o != g.ids[i] {
			g.cut[[2]paxos.NodeID{g.ids[i], o}] = true
			g.cut[[2]paxos.NodeID{o, g.ids[i]}] = true
		}
	}
}

// run drives the group for ticks, proposing at the leader, isolating the
// leader now and then so leadership moves.
func (g *group) run(ticks int) {
	isolatedUntil := -1
	for g.now = 1; g.now <= ticks; g.now++ {
		for i, n := range g.nodes {
			n.Tick()
			g.handleReady(i)
		}
		g.tickPlanes()
		if l := g.leader(); l >= 0 && g.rng.Intn(3) == 0 {
			if g.nodes[l].Propose([][]byte{fmt.Appendf(nil, "cmd-%d", g.now)}) == nil {
				g.handleReady(l)
			}
		}
		if isolatedUntil < 0 && g.rng.Intn(400) == 0 {
			if l := g.leader(); l >= 0 {
				g.isolate(l)
				isolatedUntil = g.now + 30 + g.rng.Intn(40)
			}
		}
		if g.now == isolatedUntil {
			g.cut = map[[2]paxos.NodeID]bool{}
			isolatedUntil = -1
		}
		// Deliver what is due, in a random order (reordering).
		var due []paxos.Message
		rest := g.queue[:0]
		for _, q := range g.queue {
			if q.due <= g.now {
				due = append(due, q.m)
			} else {
				rest = append(rest, q)
			}
		}
		g.queue = rest
		g.rng.Shuffle(len(due), func(a, b int) { due[a], due[b] = due[b], due[a] })
		for _, m := range due {
			g.deliver(m)
		}
	}
}

func TestCheckerWithPaxos(t *testing.T) {
	var total CheckResult
	var fast uint64
	traceDir := os.Getenv("ACCEL_TRACE_DIR") // set to keep traces for the RTL co-simulation
	for _, size := range []int{3, 5} {
		for seed := int64(1); seed <= 4; seed++ {
			g := newGroup(t, seed, size, true)
			g.run(3000)
			r := g.chk.Result()
			if r.Mismatches != 0 {
				t.Fatalf("size=%d seed=%d: %v: %s", size, seed, r, r.First)
			}
			if r.Commits < 100 {
				t.Fatalf("size=%d seed=%d: only %d commits", size, seed, r.Commits)
			}
			total.Commits += r.Commits
			total.HandUps += r.HandUps
			total.Excused += r.Excused
			for i, p := range g.planes {
				fast += p.Stats().FastAccepts
				if err := p.Close(); err != nil {
					t.Fatal(err)
				}
				res, err := Replay(bytes.NewReader(g.traces[i].Bytes()))
				if err != nil || res.Mismatches != 0 {
					t.Fatalf("replay of node %d: %+v %v", i+1, res, err)
				}
				if traceDir != "" {
					name := filepath.Join(traceDir, fmt.Sprintf("paxos-n%d-seed%d-node%d.trace", size, seed, i+1))
					if err := os.WriteFile(name, g.traces[i].Bytes(), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
	fmt.Printf("%v excused=%d fast_accepts=%d (paxos group, 3 and 5 nodes, 4 seeds each, leader isolations)\n", total, total.Excused, fast)
}

// TestCheckerWithPaxosPlantedBug runs the same group with every plane's
// quorum register one too low; the checker must see mismatches.
func TestCheckerWithPaxosPlantedBug(t *testing.T) {
	g := newGroup(t, 1, 5, false)
	g.planeQ = 2
	g.dropPct = 30 // lose acks, so some slots sit at exactly 2 acks
	g.run(1500)
	r := g.chk.Result()
	fmt.Printf("accel: planted quorum-1 (paxos group): commits=%d mismatches=%d caught\n", r.Commits, r.Mismatches)
	if r.Mismatches == 0 {
		t.Fatalf("planted bug not caught: %v", r)
	}
}
