package replica

import (
	"fmt"
	"os"
	"testing"
)

// rsimDeterminismSeeds is how many seeds TestReplicaSimIsDeterministic
// runs twice each (and as many again with the planted bug).
const rsimDeterminismSeeds = 8

// testingRsimApplyBySelect, when true, makes the simulator's apply step
// choose its input with select, as it did until 2026-12-05: Go picks at
// random among ready cases, and a compaction's flush is ready only once
// Pebble's background flush finished in real time, so a seed no longer
// chose every interleaving (of 12 seeds run twice, 10 gave different
// runs). The planted nondeterminism of TestReplicaSimIsDeterministic.
var testingRsimApplyBySelect bool

// applyBySelect is the planted apply step (testingRsimApplyBySelect).
func (s *rsim) applyBySelect(n *rsimNode) {
	r := n.r
	select {
	case it := <-r.applyC:
		s.checkAgreement(n, it.entries)
		r.applyInput(it)
	case <-r.snapNow:
		r.snapshotNow()
	case <-r.apply.flushing:
		r.flushed()
	default:
	}
}

// TestReplicaSimIsDeterministic holds the simulator to its contract
// (replicasim_test.go: a seed chooses every interleaving, so the command a
// violation prints replays it): each seed run twice gives the same
// result, every count and violation alike. Planted
// (testingRsimApplyBySelect), the same check sees runs differ.
func TestReplicaSimIsDeterministic(t *testing.T) {
	differ := rsimSeedsThatDiffer(t, rsimDeterminismSeeds)
	for _, d := range differ {
		t.Errorf("seed run twice gave two runs: %s", d)
	}
	testingRsimApplyBySelect = true
	defer func() { testingRsimApplyBySelect = false }()
	planted := rsimSeedsThatDiffer(t, rsimDeterminismSeeds)
	caught := len(planted) > 0
	fmt.Printf("replicasim determinism: seeds=%d differing=%d; planted (apply by select): differing=%d caught=%v\n",
		rsimDeterminismSeeds, len(differ), len(planted), caught)
	if !caught {
		t.Errorf("planted apply by select: all %d seeds ran the same twice; the check cannot see nondeterminism", rsimDeterminismSeeds)
	}
}

// rsimSeedsThatDiffer runs seeds 1..n twice each and describes those
// whose two runs differ.
func rsimSeedsThatDiffer(t *testing.T, n int) []string {
	root := t.TempDir()
	var differ []string
	for seed := uint64(1); seed <= uint64(n); seed++ {
		a, b := runReplicaSim(seed, root), runReplicaSim(seed, root)
		if fa, fb := fmt.Sprintf("%+v", a), fmt.Sprintf("%+v", b); fa != fb {
			differ = append(differ, fmt.Sprintf("seed %d: %s, then %s", seed, fa, fb))
		}
	}
	if entries, err := os.ReadDir(root); err == nil && len(entries) != 0 {
		t.Errorf("%d simulator directories left behind", len(entries))
	}
	return differ
}
