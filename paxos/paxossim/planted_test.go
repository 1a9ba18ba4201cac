package paxossim

import (
	"strings"
	"testing"

	"synod/paxos"
)

// plantedSeeds is the batch a planted bug must be caught in. Each planted
// bug is caught in most seeds; the test only needs one.
const plantedSeeds = 60

// TestPlantedQuorumBugIsCaught turns the leader's quorum into n/2 through
// the core's test hook and requires the simulator to report violations
// under partitions: a minority leader then commits on its own.
func TestPlantedQuorumBugIsCaught(t *testing.T) {
	paxos.TestingQuorumOffByOne = true
	defer func() { paxos.TestingQuorumOffByOne = false }()
	opts := Options{Faults: FaultPartition | FaultOneWay | FaultDrop | FaultReorder | FaultCrash}
	sum := RunBatch(1, plantedSeeds, opts, 0, nil)
	t.Logf("with quorum n/2: %s, %d failing seeds", sum.String(), len(sum.Failed))
	if sum.Violations == 0 {
		t.Fatalf("a quorum of n/2 went unnoticed in %d seeds", plantedSeeds)
	}
	// Not only the AckEvent quorum check: the end-to-end checks (values per
	// slot, replica state, linearizability) must see the damage too.
	if sum.SafetyViolations == 0 {
		t.Fatalf("a quorum of n/2 caused no end-to-end safety violation in %d seeds", plantedSeeds)
	}
	var endToEnd int
	for _, r := range sum.Failed {
		if r.SafetyViolations > 0 {
			endToEnd++
		}
	}
	t.Logf("end-to-end safety violations in %d of %d failing seeds", endToEnd, len(sum.Failed))
	for _, r := range sum.Failed[:min(3, len(sum.Failed))] {
		t.Logf("caught: %s", r)
	}
}

// TestPlantedDivergenceIsCaught corrupts one replica's application of its
// committed log and requires the state check to notice.
func TestPlantedDivergenceIsCaught(t *testing.T) {
	caught := 0
	for seed := uint64(1); seed <= 5; seed++ {
		r := Run(seed, Options{NoFaults: true, plantDivergence: 2})
		if r.Failed() && strings.Contains(strings.Join(r.Messages, "\n"), "diverged") {
			caught++
		}
	}
	if caught != 5 {
		t.Fatalf("divergent replica caught in %d of 5 seeds", caught)
	}
}

// TestPlantedStaleReadsAreCaught serves reads from local state without
// ReadIndex and requires porcupine to find a non-linearizable history.
func TestPlantedStaleReadsAreCaught(t *testing.T) {
	opts := Options{Faults: FaultPartition | FaultCrash | FaultReorder, plantStaleReads: true}
	sum := RunBatch(1, plantedSeeds, opts, 0, nil)
	lin := 0
	for _, r := range sum.Failed {
		if strings.Contains(strings.Join(r.Messages, "\n"), "not linearizable") {
			lin++
		}
	}
	t.Logf("with stale reads: %s, %d non-linearizable histories", sum.String(), lin)
	if lin == 0 {
		t.Fatalf("stale reads went unnoticed in %d seeds", plantedSeeds)
	}
}
