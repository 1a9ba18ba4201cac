package rtl

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"synod/accel"
	"synod/paxos"
	"synod/pmem"
)

// flakyWAL is the fast path's log in the cluster workload: it keeps
// nothing and fails an append or persist with probability 1/failOneIn, so
// traces carry both WAL outcomes.
type flakyWAL struct {
	rng       *rand.Rand
	failOneIn int
}

func (w *flakyWAL) fail() error {
	if w.failOneIn > 0 && w.rng.IntN(w.failOneIn) == 0 {
		return fmt.Errorf("injected WAL failure")
	}
	return nil
}
func (w *flakyWAL) Append([]pmem.Record) error    { return w.fail() }
func (w *flakyWAL) Persist() error                { return w.fail() }
func (w *flakyWAL) SetPromised(pmem.Ballot) error { return w.fail() }

var (
	_ accel.WAL      = (*flakyWAL)(nil)
	_ accel.Promiser = (*flakyWAL)(nil)
)

type msgKind uint8

const (
	msgAccept msgKind = iota
	msgAccepted
	msgHeartbeat
	msgHeartbeatAck
)

// clusterMsg is one message on the simulated network.
type clusterMsg struct {
	kind      msgKind
	from, to  int // node indexes
	slot      paxos.Slot
	ballot    paxos.Ballot
	sentAt    uint64
	payload   int
	deliverAt uint64
}

// clusterConfig shapes one synthetic cluster run.
type clusterConfig struct {
	Name     string
	Nodes    int // cluster size (members set in the table); <= spec.Replicas
	Quorum   int
	Steps    int
	Seed     uint64
	DropPct  int // message loss, percent
	DupPct   int // duplicated deliveries, percent
	WALFail  int // one WAL failure in this many writes (0: never)
	Tenants  int // tenant entries configured on the leader (<= spec.TenantsMax)
	Proposes int // most proposals per step
}

// clusterTraces runs a synthetic cluster of accel planes, one per node,
// exchanging Accept/Accepted/heartbeat messages over a lossy, reordering,
// duplicating network, with leader changes (some with stale messages still
// in flight and followers that learn the new ballot late), pauses long
// enough for leases to lapse and election timers to fire, membership
// changes, WAL failures and tenant admission from a noisy and a quiet
// tenant. Every plane records its own trace; the paths are returned.
//
// The software around the planes is the least Paxos needs to drive them:
// the leader arms each slot and sends Accept, followers answer through the
// fast path, commits advance the leader's window base, and followers move
// their base to the leader's commit point when they hear a heartbeat. Hand-
// ups are counted (software's job) except the ones this driver reacts to.
func clusterTraces(t testing.TB, spec accel.Spec, cfg clusterConfig, dir string) []string {
	t.Helper()
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xc105))
	var now uint64 = 1
	clock := func() uint64 { return now }

	type node struct {
		p     *accel.Plane
		f     *os.File
		w     *bufio.Writer
		path  string
		id    paxos.NodeID
		base  paxos.Slot
		fresh bool // knows the current ballot
	}
	nodes := make([]*node, cfg.Nodes)
	var out []accel.Event
	for i := range nodes {
		path := filepath.Join(dir, fmt.Sprintf("%s-node%d.trace", cfg.Name, i+1))
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		w := bufio.NewWriterSize(f, 1<<20)
		wal := &flakyWAL{rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i))), failOneIn: cfg.WALFail}
		p, err := accel.New(spec, accel.WithTrace(w), accel.WithClock(clock), accel.WithWAL(wal))
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = &node{p: p, f: f, w: w, path: path, id: paxos.NodeID(i + 1), base: 1, fresh: true}
		for j := 0; j < cfg.Nodes; j++ {
			out = p.SetMember(out[:0], j, paxos.NodeID(j+1))
		}
		out = p.SetSelf(out[:0], i)
		out = p.SetQuorum(out[:0], cfg.Quorum)
		out = p.SetWindowBase(out[:0], 1)
	}

	leader := 0
	ballot := paxos.Ballot{Round: 1, Node: 1}
	var (
		nextSlot  paxos.Slot = 1
		base      paxos.Slot = 1 // lowest uncommitted slot
		committed            = map[paxos.Slot]bool{}
		net       []clusterMsg
		removed   = -1 // member index currently removed from the table, or -1
		handUps   uint64
	)
	W := paxos.Slot(spec.WindowSlots)

	becomeLeader := func(i int) {
		n := nodes[i]
		out = n.p.SetBallot(out[:0], ballot)
		out = n.p.SetPromised(out[:0], ballot)
		out = n.p.SetWindowBase(out[:0], base)
		out = n.p.SetRole(out[:0], accel.RoleLeader)
		n.fresh = true
		nextSlot = base // re-propose everything not known committed
		tenants := min(cfg.Tenants, spec.TenantsMax)
		for ti := 0; ti < tenants; ti++ {
			ops, bytes := uint64(200+rng.IntN(2000)), uint64(50_000+rng.IntN(500_000))
			if ti == 0 {
				ops, bytes = 50, 20_000 // the noisy tenant's contract is small
			}
			out = n.p.SetTenant(out[:0], ti, ops, uint64(rng.IntN(40)), bytes, uint64(rng.IntN(100_000)))
		}
	}
	for i := range nodes {
		if i != leader {
			out = nodes[i].p.SetPromised(out[:0], ballot)
			out = nodes[i].p.SetRole(out[:0], accel.RoleFollower)
		}
	}
	becomeLeader(leader)

	send := func(m clusterMsg) {
		if rng.IntN(100) < cfg.DropPct {
			return
		}
		m.deliverAt = now + uint64(20+rng.IntN(400))
		net = append(net, m)
		if rng.IntN(100) < cfg.DupPct {
			m.deliverAt += uint64(rng.IntN(2000))
			net = append(net, m)
		}
	}
	// emit routes one plane's outputs: what the network should carry, and
	// the software reactions this driver models.
	var emit func(i int, evs []accel.Event)
	emit = func(i int, evs []accel.Event) {
		for _, e := range evs {
			switch e.Kind {
			case accel.OutCommit:
				if i == leader && e.Ballot == ballot {
					committed[e.Slot] = true
				}
			case accel.OutSendAccepted:
				to := int(e.Node) - 1
				send(clusterMsg{kind: msgAccepted, from: i, to: to, slot: e.Slot, ballot: e.Ballot})
			case accel.OutHeartbeat:
				for j := range nodes {
					if j != i {
						send(clusterMsg{kind: msgHeartbeat, from: i, to: j, ballot: e.Ballot, sentAt: e.Value})
					}
				}
			case accel.OutHeartbeatAck:
				to := int(e.Node) - 1
				send(clusterMsg{kind: msgHeartbeatAck, from: i, to: to, ballot: e.Ballot, sentAt: e.Value})
				// The heartbeat carries the leader's commit point.
				if nodes[i].base < base && rng.IntN(3) > 0 {
					nodes[i].base = base
					out = nodes[i].p.SetWindowBase(out[:0], base)
				}
			case accel.OutHandUp:
				handUps++
				// Software learns a higher ballot from a heartbeat and
				// promises it (the Phase 1 it missed).
				if accel.Kind(e.Len) == accel.InHeartbeat && e.Reason() == accel.ReasonHigherBallot && i != leader {
					out = nodes[i].p.SetPromised(out[:0], e.Ballot)
					nodes[i].fresh = true
				}
			}
		}
	}
	deliver := func(m clusterMsg) {
		n := nodes[m.to]
		switch m.kind {
		case msgAccept:
			payload := make([]byte, m.payload)
			emit(m.to, n.p.OnAccept(out[:0], m.slot, m.ballot, nodes[m.from].id, payload))
		case msgAccepted:
			emit(m.to, n.p.OnAccepted(out[:0], m.slot, m.ballot, nodes[m.from].id))
		case msgHeartbeat:
			emit(m.to, n.p.OnHeartbeat(out[:0], nodes[m.from].id, m.ballot, m.sentAt))
		case msgHeartbeatAck:
			emit(m.to, n.p.OnHeartbeatAck(out[:0], nodes[m.from].id, m.ballot, m.sentAt))
		}
	}

	for step := 0; step < cfg.Steps; step++ {
		// Time: mostly short steps; now and then a pause past the lease
		// and election timeouts (a stalled leader).
		if rng.IntN(400) == 0 {
			now += uint64(spec.ElectionTicks) + uint64(rng.IntN(int(spec.ElectionJitterTicks)+1))
		} else {
			now += uint64(50 + rng.IntN(400))
		}

		// Timers first, as the heartbeat loop would run them.
		for i, n := range nodes {
			emit(i, n.p.Tick(out[:0], now))
		}

		// Deliver what is due, in random order.
		due := net[:0:0]
		keep := net[:0]
		for _, m := range net {
			if m.deliverAt <= now {
				due = append(due, m)
			} else {
				keep = append(keep, m)
			}
		}
		net = keep
		rng.Shuffle(len(due), func(a, b int) { due[a], due[b] = due[b], due[a] })
		for _, m := range due {
			deliver(m)
		}

		// Advance the commit point and the leader's window.
		moved := false
		for committed[base] {
			delete(committed, base)
			base++
			moved = true
		}
		if moved {
			out = nodes[leader].p.SetWindowBase(out[:0], base)
		}

		// Propose: arm and send Accept. Now and then the leader runs past
		// its window (handed up) to exercise the edge.
		for k := rng.IntN(cfg.Proposes + 1); k > 0; k-- {
			if nextSlot >= base+W && rng.IntN(10) > 0 {
				break
			}
			slot := nextSlot
			nextSlot++
			emit(leader, nodes[leader].p.Arm(out[:0], slot, ballot))
			size := 16 + rng.IntN(1024)
			for j := range nodes {
				if j != leader {
					send(clusterMsg{kind: msgAccept, from: leader, to: j, slot: slot, ballot: ballot, payload: size})
				}
			}
		}
		// Re-send Accept for the oldest uncommitted slot now and then
		// (retransmission after loss).
		if base < nextSlot && rng.IntN(4) == 0 {
			for j := range nodes {
				if j != leader {
					send(clusterMsg{kind: msgAccept, from: leader, to: j, slot: base, ballot: ballot, payload: 64})
				}
			}
		}

		// Clients: the noisy tenant 0 sends far over its contract, the
		// others stay near theirs.
		if cfg.Tenants > 0 {
			for k := rng.IntN(4); k > 0; k-- {
				ti := 0
				if rng.IntN(3) == 0 {
					ti = 1 + rng.IntN(cfg.Tenants)
				}
				nodes[leader].p.Admit(ti, 64+rng.IntN(4000))
			}
		}

		// Membership: remove a follower from the tables for a while.
		if removed < 0 && rng.IntN(3000) == 0 {
			removed = (leader + 1 + rng.IntN(cfg.Nodes-1)) % cfg.Nodes
			for _, n := range nodes {
				out = n.p.SetMember(out[:0], removed, 0)
			}
		} else if removed >= 0 && rng.IntN(500) == 0 {
			for _, n := range nodes {
				out = n.p.SetMember(out[:0], removed, nodes[removed].id)
			}
			removed = -1
		}

		// Leader change: a new node takes over with a higher ballot. Some
		// followers learn it at once, the rest from its heartbeats; old
		// messages stay in flight.
		if rng.IntN(1500) == 0 {
			old := leader
			leader = (leader + 1 + rng.IntN(cfg.Nodes-1)) % cfg.Nodes
			ballot = paxos.Ballot{Round: ballot.Round + 1, Node: nodes[leader].id}
			out = nodes[old].p.SetRole(out[:0], accel.RoleFollower)
			for i, n := range nodes {
				n.fresh = false
				if i != leader && rng.IntN(4) > 0 {
					out = n.p.SetPromised(out[:0], ballot)
					n.fresh = true
				}
			}
			committed = map[paxos.Slot]bool{}
			becomeLeader(leader)
		}
	}

	paths := make([]string, len(nodes))
	for i, n := range nodes {
		if err := n.p.Close(); err != nil {
			t.Fatal(err)
		}
		if err := n.w.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := n.f.Close(); err != nil {
			t.Fatal(err)
		}
		paths[i] = n.path
	}
	_ = handUps
	return paths
}
