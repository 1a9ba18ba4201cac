package paxossim

import (
	"fmt"
	"strings"
	"testing"

	"synod/paxos"
)

// TestPlantedReballotWithoutBaseIsCaught: a re-ballot (paxos reballot.go)
// may name only a record already stored, or ahead of it in the same
// Ready.Accepted. The durable store resolves each re-ballot against the
// record it names and reports one it does not hold; planted
// (TestingReballotAnyBase: a leader's own acceptance still being written
// counts as a base), the own writes that complete out of order and the
// crashes that lose them leave re-ballots without their record. Without
// the plant the same seeds store thousands of re-ballots, all resolved.
func TestPlantedReballotWithoutBaseIsCaught(t *testing.T) {
	opts := Options{Faults: FaultPersist | FaultCrash | FaultPartition | FaultDrop, Intensity: 2}
	clean := RunBatch(1, plantedLeaseSeeds, opts, 0, nil)
	if clean.Violations != 0 || clean.Counts.Reballots == 0 {
		t.Fatalf("without the plant: %s, %d re-ballots: want no violation and some re-ballots", clean.String(), clean.Counts.Reballots)
	}
	paxos.TestingReballotAnyBase = true
	defer func() { paxos.TestingReballotAnyBase = false }()
	sum := RunBatch(1, plantedLeaseSeeds, opts, 0, nil)
	caught := 0
	for _, r := range sum.Failed {
		if strings.Contains(strings.Join(r.Messages, "\n"), "re-ballot") {
			caught++
		}
	}
	fmt.Printf("paxossim re-ballots: seeds=%d reballots=%d violations=%d; planted (any base): reballots=%d failing_seeds=%d caught=%v\n",
		plantedLeaseSeeds, clean.Counts.Reballots, clean.Violations, sum.Counts.Reballots, caught, caught > 0)
	if caught == 0 {
		t.Fatalf("re-ballots naming unstored records went unnoticed in %d seeds: %s", plantedLeaseSeeds, sum.String())
	}
	for _, r := range sum.Failed[:min(2, len(sum.Failed))] {
		t.Logf("caught: %s", r)
	}
}
