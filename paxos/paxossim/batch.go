package paxossim

import (
	"fmt"
	"runtime"
	"sync"
)

// Summary aggregates a batch of runs.
type Summary struct {
	Seeds      int
	Ops        int
	Faults     int
	Violations int
	// SafetyViolations counts the end-to-end safety violations (two values
	// in a slot, diverged replicas, non-linearizable histories).
	SafetyViolations int
	Failed           []*Result // in seed order
	Covered          FaultSet  // union of the fault kinds the batch ran
	Counts           Counts
	Net              netStats
	// LeaseChecks and LeaseViolations are the lease oracle's (lease.go).
	LeaseChecks, LeaseViolations int
	// QuorumChecks and QuorumViolations are the voter-quorum oracle's
	// (check_quorum.go).
	QuorumChecks, QuorumViolations int
}

// Detail describes what the batch exercised, one line.
func (s *Summary) Detail() string {
	c := s.Counts
	return fmt.Sprintf("kinds=%s crashes=%d (mid-Ready %d, all-at-once %d) partitions=%d one-way=%d conf-changes=%d fresh-nodes=%d "+
		"pauses=%d compactions=%d snapshot-installs=%d transfers=%d (failed %d, stale %d, crash after staging %d) reads=%d "+
		"own-writes=%d (slow %d, out of order %d, superseded %d, lost %d, survived %d, crashes after send %d, with a write in flight %d) "+
		"re-ballots=%d msgs sent=%d dropped=%d duplicated=%d delayed=%d blocked=%d",
		s.Covered, c.Crashes, c.MidReadyCrashes, c.TotalCrashes, c.Partitions, c.OneWays, c.ConfChanges, c.FreshNodes,
		c.Pauses, c.Compactions, c.SnapshotsInstalled, c.TransfersStarted, c.TransfersFailed, c.TransfersStale, c.StagedCrashes,
		c.LeaseOrBarrierReads,
		c.OwnWrites, c.OwnWritesSlow, c.OwnWritesReordered, c.OwnWritesSuperseded, c.OwnWritesLost, c.OwnWritesSurvived, c.CrashesAfterSend, c.CrashesInFlight,
		c.Reballots, s.Net.sent, s.Net.dropped, s.Net.duplicated, s.Net.delayed, s.Net.blocked)
}

// String is the one summary line the test prints.
func (s *Summary) String() string {
	return fmt.Sprintf("paxossim: seeds=%d ops=%d faults=%d violations=%d lease_checks=%d lease_violations=%d quorum_checks=%d quorum_violations=%d",
		s.Seeds, s.Ops, s.Faults, s.Violations, s.LeaseChecks, s.LeaseViolations, s.QuorumChecks, s.QuorumViolations)
}

// RunBatch runs seeds first, first+1, ... first+count-1 on workers
// goroutines (0: GOMAXPROCS). Each run is independent and deterministic, so
// the summary does not depend on scheduling. onResult, when set, is called
// for every result in seed order.
func RunBatch(first uint64, count int, opts Options, workers int, onResult func(*Result)) Summary {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	results := make([]*Result, count)
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				results[i] = Run(first+uint64(i), opts)
			}
		}()
	}
	for i := range count {
		next <- i
	}
	close(next)
	wg.Wait()
	var sum Summary
	for _, r := range results {
		sum.Seeds++
		sum.Ops += r.Ops
		sum.Faults += r.FaultCount
		sum.Violations += r.Violations
		sum.SafetyViolations += r.SafetyViolations
		sum.Covered |= r.Faults
		sum.Counts.add(r.Counts)
		sum.Net.add(r.Net)
		sum.LeaseChecks += r.LeaseChecks
		sum.LeaseViolations += r.LeaseViolations
		sum.QuorumChecks += r.QuorumChecks
		sum.QuorumViolations += r.QuorumViolations
		if r.Failed() {
			sum.Failed = append(sum.Failed, r)
		}
		if onResult != nil {
			onResult(r)
		}
	}
	return sum
}
