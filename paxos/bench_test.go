package paxos

import (
	"fmt"
	"testing"
)

// benchGroup is a bare in-memory group: Readys are "persisted" by dropping
// them and messages are handed over directly, so the benchmark measures the
// state machine (Step, Ready, Advance) and nothing else.
type benchGroup struct {
	nodes   []*Node
	queue   []Message
	commits int
}

func newBenchGroup(b *testing.B, size int) *benchGroup {
	ids := make([]NodeID, size)
	for i := range ids {
		ids[i] = NodeID(i + 1)
	}
	g := &benchGroup{}
	for _, id := range ids {
		n, err := NewNode(testConfig(id, ids), DurableState{})
		if err != nil {
			b.Fatal(err)
		}
		g.nodes = append(g.nodes, n)
	}
	for range 100 {
		for _, n := range g.nodes {
			n.Tick()
		}
		g.run()
		if n := g.nodes[0]; n.role == RoleLeader && n.ownCommitted() {
			return g
		}
		g.nodes[0].electionElapsed = g.nodes[0].electionTimeout
	}
	b.Fatal("no leader")
	return nil
}

func (g *benchGroup) run() {
	for {
		moved := false
		for _, n := range g.nodes {
			if !n.HasReady() {
				continue
			}
			moved = true
			rd := n.Ready()
			g.queue = append(g.queue, rd.Messages...)
			if n.id == 1 {
				g.commits += len(rd.Committed)
			}
			n.Advance(rd)
		}
		q := g.queue
		g.queue = g.queue[len(g.queue):]
		for i := range q {
			moved = true
			if err := g.nodes[q[i].To-1].Step(q[i]); err != nil {
				panic(err)
			}
		}
		if !moved {
			return
		}
	}
}

func benchStepReady(b *testing.B, size, perOp int) {
	g := newBenchGroup(b, size)
	leader := g.nodes[0]
	cmd := make([]byte, 64)
	cmds := make([][]byte, perOp)
	for i := range cmds {
		cmds[i] = cmd
	}
	start := leader.commit
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%4096 == 4095 {
			// Keep the logs short, as an application taking snapshots would.
			for _, n := range g.nodes {
				if err := n.Compact(n.applied); err != nil {
					b.Fatal(err)
				}
			}
		}
		// One proposal (batched into one slot) per op, driven to commit on
		// every node.
		if err := leader.Propose(cmds); err != nil {
			b.Fatal(err)
		}
		g.run()
	}
	b.StopTimer()
	if got := leader.commit - start; got != Slot(b.N) {
		b.Fatalf("committed %d slots, want %d", got, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
	b.ReportMetric(float64(b.N*perOp)/b.Elapsed().Seconds(), "cmds/s")
}

func BenchmarkStepReady3(b *testing.B) {
	for _, k := range []int{1, 64} {
		b.Run(fmt.Sprintf("cmds=%d", k), func(b *testing.B) { benchStepReady(b, 3, k) })
	}
}

func BenchmarkStepReady5(b *testing.B) {
	for _, k := range []int{1, 64} {
		b.Run(fmt.Sprintf("cmds=%d", k), func(b *testing.B) { benchStepReady(b, 5, k) })
	}
}
