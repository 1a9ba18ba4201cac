package paxossim

import (
	"fmt"
	"testing"

	"synod/paxos"
)

// transferSeeds is the batch of the leadership-transfer checks.
const transferSeeds = 200

// transferOptions is the hand-over profile: the leader is asked to hand
// over often (leadership.go), on three nodes with lease faults and one-way
// links, where a lease kept by a leader that released its acceptors is
// soonest overlapped by the target's.
var transferOptions = Options{LeaderTransfers: true, Nodes: 3, Faults: FaultLease | FaultOneWay | FaultDrop | FaultReorder}

// TestSimulationLeaderTransfers: leadership hand-overs under faults keep
// every oracle (linearizability, one value per slot, lease cover and lease
// reads), and hand-overs do complete.
func TestSimulationLeaderTransfers(t *testing.T) {
	sum := RunBatch(1, transferSeeds, transferOptions, 0, nil)
	fmt.Printf("paxossim leader transfers: seeds=%d ops=%d hand_overs=%d/%d at_once=%d violations=%d lease_checks=%d lease_violations=%d\n",
		sum.Seeds, sum.Ops, sum.Counts.TransfersDone, sum.Counts.Transfers, sum.Counts.TransfersNow, sum.Violations, sum.LeaseChecks, sum.LeaseViolations)
	for i, r := range sum.Failed {
		if i == 5 {
			break
		}
		t.Errorf("seed %d: %s", r.Seed, r)
	}
	if sum.Counts.TransfersDone == 0 {
		t.Errorf("no hand-over completed in %d seeds (%d started)", transferSeeds, sum.Counts.Transfers)
	}
}

// TestPlantedTransferKeepsLeaseIsCaught plants
// paxos.TestingTransferKeepsLease (the leader releases its acceptors'
// leases for the target but goes on leading and answering lease reads):
// the lease oracle must catch it in at least one seed of the profile the
// clean run passes.
func TestPlantedTransferKeepsLeaseIsCaught(t *testing.T) {
	paxos.TestingTransferKeepsLease = true
	defer func() { paxos.TestingTransferKeepsLease = false }()
	sum := RunBatch(1, transferSeeds, transferOptions, 0, nil)
	seeds := 0
	var first *Result
	for _, r := range sum.Failed {
		if r.LeaseViolations > 0 || r.SafetyViolations > 0 {
			seeds++
			if first == nil {
				first = r
			}
		}
	}
	fmt.Printf("paxossim planted transfer-keeps-lease: seeds=%d caught_seeds=%d lease_violations=%d caught=%v\n",
		transferSeeds, seeds, sum.LeaseViolations, seeds > 0)
	if seeds == 0 {
		t.Fatalf("the lease oracle missed a leader that released its acceptors' leases and kept serving, in %d seeds", transferSeeds)
	}
	t.Logf("caught: %s", first)
}
