package paxos

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
)

var (
	randomSeeds = flag.Int("paxos.seeds", 200, "seeds for TestRandomFaults")
	randomConf  = flag.Bool("paxos.conf", true, "membership changes and compaction in TestRandomFaults")
)

// TestRandomFaults drives groups through drops, duplicates, reordering,
// partitions and crash/restart, checking that every node applies the same
// value per slot and that every acknowledged proposal stays committed. The
// full simulator (paxossim) checks linearizability on top.
func TestRandomFaults(t *testing.T) {
	for seed := range *randomSeeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runRandom(t, uint64(seed)) })
	}
}

func runRandom(t testing.TB, seed uint64) *network {
	rng := rand.New(rand.NewPCG(seed, 99))
	size := 3 + 2*rng.IntN(2)
	nw := newNetwork(t, size)
	// The address book: every id that may ever join.
	book := []NodeID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	for _, id := range nw.ids {
		cfg := testConfig(id, nw.ids)
		cfg.KnownNodes = book
		cfg.Seed = int64(seed)
		nw.start(id, cfg)
	}
	initial := nw.ids[:size:size]
	next := 0
	for step := range 400 {
		switch r := rng.IntN(100); {
		case r < 3:
			nw.isolate(nw.ids[rng.IntN(len(nw.ids))])
		case r < 6:
			nw.heal()
		case r < 8:
			id := nw.ids[rng.IntN(len(nw.ids))]
			if !nw.down[id] {
				nw.crash(id)
			}
		case r < 12:
			for _, id := range nw.ids {
				if nw.down[id] {
					nw.restart(id)
					break
				}
			}
		case r < 40:
			if l := nw.leader(); l != 0 {
				_ = nw.nodes[l].Propose([][]byte{[]byte(fmt.Sprint(next))})
				next++
			}
		case r < 42 && *randomConf:
			l := nw.leader()
			if l == 0 {
				break
			}
			members := nw.nodes[l].Status().Members
			if rng.IntN(2) == 0 && len(members) < 5 && len(nw.ids) < len(book) {
				id := NodeID(len(nw.ids) + 1)
				if nw.nodes[l].ProposeConfChange(ConfChange{Type: ConfAddNode, Node: id}) == nil {
					// A joiner starts with the initial membership.
					cfg := testConfig(id, initial)
					cfg.KnownNodes = book
					cfg.Seed = int64(seed)
					nw.start(id, cfg)
				}
			} else if len(members) > 2 {
				_ = nw.nodes[l].ProposeConfChange(ConfChange{Type: ConfRemoveNode, Node: members[rng.IntN(len(members))]})
			}
		case r < 45 && *randomConf:
			id := nw.ids[rng.IntN(len(nw.ids))]
			if n := nw.nodes[id]; !nw.down[id] && n.applied > 0 {
				if err := nw.compact(id, []byte(fmt.Sprintf("snap%d", n.applied))); err != nil {
					t.Fatal(err)
				}
			}
		}
		drop := rng.IntN(4) == 0
		nw.dropNext = func(m Message) bool { return drop && rng.IntN(5) == 0 }
		// Duplicate and reorder part of the queue before delivery.
		for _, id := range nw.ids {
			nw.handleReady(id)
		}
		if len(nw.queue) > 1 && rng.IntN(3) == 0 {
			nw.queue = append(nw.queue, nw.queue[rng.IntN(len(nw.queue))])
			rng.Shuffle(len(nw.queue), func(i, j int) { nw.queue[i], nw.queue[j] = nw.queue[j], nw.queue[i] })
		}
		nw.tick(1)
		if step%50 == 49 {
			nw.checkAgree()
		}
	}
	// Heal everything: the group must make progress again.
	nw.dropNext = nil
	nw.heal()
	for _, id := range nw.ids {
		if nw.down[id] {
			nw.restart(id)
		}
	}
	l := nw.elect()
	nw.propose(l, "final")
	nw.tick(40)
	var final Slot
	for _, e := range nw.applied[l] {
		if e.Type == EntryNormal && len(e.Cmds) == 1 && string(e.Cmds[0]) == "final" {
			final = e.Slot
		}
	}
	if final == 0 {
		t.Fatalf("seed %d: leader %d did not apply the final proposal", seed, l)
	}
	for _, id := range nw.nodes[l].Status().Members {
		if a := nw.durable[id].applied; a < final {
			t.Fatalf("seed %d: member %d applied through %d, final proposal at %d", seed, id, a, final)
		}
	}
	nw.checkAgree()
	return nw
}

// TestDeterministic replays a seed and expects the very same run.
func TestDeterministic(t *testing.T) {
	for seed := range uint64(5) {
		a, b := runRandom(t, seed), runRandom(t, seed)
		if a.sent != b.sent || fmt.Sprint(a.applied) != fmt.Sprint(b.applied) {
			t.Fatalf("seed %d: runs differ: %d vs %d messages", seed, a.sent, b.sent)
		}
	}
}

// fatalTB turns Fatal into a recoverable panic so a test can assert that a
// check fails.
type fatalTB struct {
	testing.TB
	msg string
}

type fatalPanic struct{}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	panic(fatalPanic{})
}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(fatalPanic{})
}

// caught runs fn against a fatalTB and returns the failure message, or "".
func caught(t *testing.T, fn func(tb testing.TB)) (msg string) {
	tb := &fatalTB{TB: t}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(fatalPanic); !ok {
				msg = fmt.Sprint("panic: ", r)
				return
			}
			msg = tb.msg
		}
	}()
	fn(tb)
	return ""
}

// TestRandomFaultsCatchPlantedBug shows the agreement checks can fail: with
// the quorum off by one, some seed must produce diverging replicas.
func TestRandomFaultsCatchPlantedBug(t *testing.T) {
	TestingQuorumOffByOne = true
	defer func() { TestingQuorumOffByOne = false }()
	for seed := range 100 {
		if msg := caught(t, func(tb testing.TB) { runRandom(tb, uint64(seed)) }); msg != "" {
			t.Logf("planted quorum bug caught at seed %d: %s", seed, msg)
			return
		}
	}
	t.Fatal("planted quorum bug not caught in 100 seeds")
}
