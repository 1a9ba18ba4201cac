package paxossim

import (
	"fmt"
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

// plantedLeaseSeeds is the batch of default-profile seeds (random fault
// kinds, as the CI run draws them, the lease-stress profile among them) a
// planted lease bug must be caught in by the lease oracle.
const plantedLeaseSeeds = 300

// TestPlantedLeaseBugsAreCaught plants each lease rule bug through the
// core's test hooks and requires the lease oracle (a safety oracle, not a
// golden trace) to report it in the default profile's seeds:
//   - the leader's lease dated from the arrival of the heartbeat acks
//     instead of the heartbeat's send tick;
//   - a restarted node that does not refuse new ballots for LeaseTicks;
//   - the leader's lease not reduced by DriftTicks.
func TestPlantedLeaseBugsAreCaught(t *testing.T) {
	for _, bug := range []struct {
		name string
		hook *bool
	}{
		{"lease-from-ack-arrival", &paxos.TestingLeaseFromAckArrival},
		{"no-restart-refusal", &paxos.TestingNoRestartRefusal},
		{"lease-ignores-drift", &paxos.TestingLeaseIgnoresDrift},
	} {
		t.Run(bug.name, func(t *testing.T) {
			*bug.hook = true
			defer func() { *bug.hook = false }()
			sum := RunBatch(1, plantedLeaseSeeds, Options{}, 0, nil)
			seeds := 0
			for _, r := range sum.Failed {
				if r.LeaseViolations > 0 {
					seeds++
				}
			}
			fmt.Printf("paxossim planted %s: seeds=%d lease_checks=%d lease_violations=%d failing_seeds=%d caught=%v\n",
				bug.name, plantedLeaseSeeds, sum.LeaseChecks, sum.LeaseViolations, seeds, sum.LeaseViolations > 0)
			if sum.LeaseViolations == 0 {
				t.Fatalf("the lease oracle missed %s in %d seeds", bug.name, plantedLeaseSeeds)
			}
			for _, r := range sum.Failed[:min(2, len(sum.Failed))] {
				t.Logf("caught: %s", r)
			}
		})
	}
}

// TestPlantedMembershipBugsAreCaught plants each membership bug mutation
// testing left alive and requires a safety violation (not a liveness
// failure) in the membership-heavy batch of the default run:
//   - phase 1 ignoring the memberships adopted but uncommitted
//     ConfChanges produce (end to end: two values in a slot, diverged
//     replicas);
//   - the leader assigning and sending slots past a pending ConfChange
//     (the pipeline rule, checked on every Accept a leader sends).
func TestPlantedMembershipBugsAreCaught(t *testing.T) {
	n := seedsMembershipHeavy
	for _, bug := range []struct {
		name string
		hook *bool
	}{
		{"phase1-ignores-adopted-confchange", &paxos.TestingPhase1IgnoresAdoptedConfChange},
		{"assign-past-pending-confchange", &paxos.TestingAssignPastConfChange},
	} {
		t.Run(bug.name, func(t *testing.T) {
			*bug.hook = true
			defer func() { *bug.hook = false }()
			sum := RunBatch(1, n, Options{MembershipHeavy: true}, 0, nil)
			seeds := 0
			for _, r := range sum.Failed {
				if r.SafetyViolations > 0 {
					seeds++
				}
			}
			fmt.Printf("paxossim planted %s: seeds=%d safety_violations=%d failing_seeds=%d caught=%v\n",
				bug.name, n, sum.SafetyViolations, seeds, sum.SafetyViolations > 0)
			if sum.SafetyViolations == 0 {
				t.Fatalf("no safety oracle caught %s in %d membership-heavy seeds", bug.name, n)
			}
			for _, r := range sum.Failed {
				if r.SafetyViolations > 0 {
					t.Logf("caught: %s", r)
					break
				}
			}
		})
	}
}
