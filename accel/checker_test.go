package accel

import (
	"fmt"
	"math/rand"
	"testing"

	"synod/paxos"
)

// softCounter is a stand-in for the paxos leader's own ACK counting until
// the real one runs in TestCheckerWithPaxos: it emits AckEvents the way
// paxos.AckEvent documents them.
type softCounter struct {
	quorum int
	acks   map[paxos.Slot]map[paxos.NodeID]bool
	ballot map[paxos.Slot]paxos.Ballot
	done   map[paxos.Slot]bool
}

func newSoftCounter(q int) *softCounter {
	return &softCounter{quorum: q, acks: map[paxos.Slot]map[paxos.NodeID]bool{}, ballot: map[paxos.Slot]paxos.Ballot{}, done: map[paxos.Slot]bool{}}
}

func (c *softCounter) arm(s paxos.Slot, b paxos.Ballot, self paxos.NodeID) []paxos.AckEvent {
	if c.ballot[s] == b && c.acks[s] != nil {
		return nil
	}
	c.ballot[s], c.acks[s], c.done[s] = b, map[paxos.NodeID]bool{}, false
	return c.ack(s, b, self)
}

func (c *softCounter) ack(s paxos.Slot, b paxos.Ballot, from paxos.NodeID) []paxos.AckEvent {
	if c.acks[s] == nil || c.ballot[s] != b || c.acks[s][from] {
		return nil
	}
	c.acks[s][from] = true
	ev := paxos.AckEvent{Slot: s, Ballot: b, From: from, Count: len(c.acks[s])}
	if !c.done[s] && ev.Count >= c.quorum {
		c.done[s], ev.Committed = true, true
	}
	return []paxos.AckEvent{ev}
}

// runSynthetic feeds the same synthetic ack stream (reordered, duplicated,
// some acks lost, a leader change midway) to the plane and to software.
// planeQuorum lets a test plant an off-by-one bug in the plane.
func runSynthetic(t *testing.T, seed int64, replicas, quorum, planeQuorum int) CheckResult {
	p := newLeader(t, replicas, quorum, 1024)
	p.SetQuorum(nil, planeQuorum)
	sw := newSoftCounter(quorum)
	chk := NewChecker()
	rng := rand.New(rand.NewSource(seed))
	type ack struct {
		s    paxos.Slot
		b    paxos.Ballot
		from paxos.NodeID
	}
	var pending []ack
	ballot := b(1, 1)
	for s := paxos.Slot(1); s <= 600; s++ {
		if s == 300 { // leader change: same node, higher ballot, re-arms
			ballot = b(2, 1)
			p.SetBallot(nil, ballot)
		}
		chk.Plane(p.Arm(nil, s, ballot))
		chk.Software(sw.arm(s, ballot, 1))
		for from := 2; from <= replicas; from++ {
			if rng.Intn(4) == 0 {
				continue // lost
			}
			for d := 0; d <= rng.Intn(2); d++ {
				pending = append(pending, ack{s, ballot, paxos.NodeID(from)})
			}
		}
		if rng.Intn(50) == 0 {
			pending = append(pending, ack{s, b(0, 1), 2}) // stale
		}
		// Deliver a random part of what is pending, in random order.
		rng.Shuffle(len(pending), func(i, j int) { pending[i], pending[j] = pending[j], pending[i] })
		n := rng.Intn(len(pending) + 1)
		for _, a := range pending[:n] {
			chk.Plane(p.OnAccepted(nil, a.s, a.b, a.from))
			chk.Software(sw.ack(a.s, a.b, a.from))
		}
		pending = append(pending[:0], pending[n:]...)
	}
	for _, a := range pending {
		chk.Plane(p.OnAccepted(nil, a.s, a.b, a.from))
		chk.Software(sw.ack(a.s, a.b, a.from))
	}
	return chk.Result()
}

func TestCheckerSyntheticAgrees(t *testing.T) {
	for _, rq := range [][2]int{{3, 2}, {5, 3}} {
		var total CheckResult
		for seed := int64(1); seed <= 5; seed++ {
			r := runSynthetic(t, seed, rq[0], rq[1], rq[1])
			if r.Mismatches != 0 {
				t.Fatalf("replicas=%d quorum=%d seed=%d: %v (%s)", rq[0], rq[1], seed, r, r.First)
			}
			total.Commits += r.Commits
			total.HandUps += r.HandUps
		}
		if total.Commits == 0 {
			t.Fatal("no commits")
		}
		fmt.Printf("%v (synthetic acks, %d replicas)\n", total, rq[0])
	}
}

// TestCheckerCatchesPlantedBug runs the plane with its quorum register off
// by one, both ways, and requires the checker to count mismatches.
func TestCheckerCatchesPlantedBug(t *testing.T) {
	for _, delta := range []int{-1, +1} {
		r := runSynthetic(t, 1, 5, 3, 3+delta)
		if r.Mismatches == 0 {
			t.Fatalf("plane quorum %+d: checker saw no mismatch: %v", delta, r)
		}
		fmt.Printf("accel: planted quorum%+d (synthetic): commits=%d mismatches=%d caught\n", delta, r.Commits, r.Mismatches)
	}
}
