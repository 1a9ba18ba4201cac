package paxossim

import (
	"fmt"
	"testing"

	"synod/paxos"
)

// TestPlantedStaleInstallIsCaught plants a wrong staleness rule in
// InstallSnapshot (paxos.TestingInstallStaleSnapshot: a snapshot above the
// log's first slot is installed even when the node's commit index passed
// it) and requires a safety violation in the default batch: only the
// offer, fetch and install flow's late transfers (one overtaken by a newer
// one, or by catch-up from the log) reach it.
func TestPlantedStaleInstallIsCaught(t *testing.T) {
	paxos.TestingInstallStaleSnapshot = true
	defer func() { paxos.TestingInstallStaleSnapshot = false }()
	const seeds = 300
	sum := RunBatch(1, seeds, Options{Faults: FaultSnapshot | FaultCrash | FaultPartition | FaultDrop}, 0, nil)
	fmt.Printf("paxossim planted install-stale-snapshot: seeds=%d safety_violations=%d failing_seeds=%d caught=%v\n",
		seeds, sum.SafetyViolations, len(sum.Failed), sum.SafetyViolations > 0)
	if sum.SafetyViolations == 0 {
		t.Fatalf("installing stale snapshots went unnoticed in %d seeds (%s)", seeds, sum.Detail())
	}
	for _, r := range sum.Failed {
		if r.SafetyViolations > 0 {
			t.Logf("caught: %s", r)
			break
		}
	}
}
