package paxossim

import "strings"

// FaultSet selects the fault kinds a run injects.
type FaultSet uint32

const (
	FaultDrop       FaultSet = 1 << iota // messages lost
	FaultDuplicate                       // messages delivered twice
	FaultReorder                         // some messages delayed long enough to be overtaken
	FaultPartition                       // symmetric partitions that later heal
	FaultOneWay                          // one-way link failures that later heal
	FaultCrash                           // crash and restart, keeping only durable state
	FaultDrift                           // node clocks tick at different rates, within DriftTicks
	FaultMembership                      // remove a member, later add it back
	FaultSnapshot                        // frequent Compact, so lagging nodes get snapshots
	FaultLease                           // lease stress: heartbeat acks late near the lease's end, pauses and restarts around LeaseTicks
	FaultPersist                         // a leader's own writes stall past an election timeout; leaders crash between their sends and their write

	faultKinds = iota
	// FaultAll enables every fault kind.
	FaultAll FaultSet = 1<<faultKinds - 1
)

var faultNames = [faultKinds]string{"drop", "dup", "reorder", "partition", "oneway", "crash", "drift", "membership", "snapshot", "lease", "persist"}

func (f FaultSet) String() string {
	var parts []string
	for i, name := range faultNames {
		if f&(1<<i) != 0 {
			parts = append(parts, name)
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// ParseFaults parses a comma-separated list of fault names ("all" for
// every kind, "none" for no faults).
func ParseFaults(s string) (FaultSet, bool) {
	var f FaultSet
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		switch p {
		case "", "none":
			continue
		case "all":
			f |= FaultAll
			continue
		}
		found := false
		for i, name := range faultNames {
			if name == p {
				f |= 1 << i
				found = true
			}
		}
		if !found {
			return 0, false
		}
	}
	return f, true
}

// Has reports whether every kind in o is in f.
func (f FaultSet) Has(o FaultSet) bool { return f&o == o }

// Fault rates and durations, all in ticks or parts per million.
const (
	crashPerTickPPM      = 15_000 // chance per tick that some node crashes
	totalCrashPerTickPPM = 2_000  // chance per tick that every node crashes at once
	downTicksMin         = 5
	downTicksMax         = 60
	partitionPerTickPPM  = 12_000
	partitionTicksMin    = 10
	partitionTicksMax    = 80
	dropPPMMax           = 100_000 // up to 10% of messages lost
	dupPPMMax            = 50_000
	longDelayPPMMax      = 50_000
	driftPPMMax          = 50_000 // a node's tick period is off by at most 5%
	confChangePerTick    = 20_000
	compactTicksMin      = 15
	compactTicksMax      = 60
	// Lease stress (FaultLease).
	leaseAckLatePPM     = 100_000 // heartbeat acks held back close to the lease's end
	leasePausePerTick   = 20_000  // chance per tick that a node (the leader one time in two) pauses
	leaseRestartPerTick = 8_000   // chance per tick of a crash with a restart within LeaseTicks
)

// randomFaults picks the fault profile of a seed: each kind with
// probability 2/3, so batches of seeds cover every kind alone and in
// combination.
func randomFaults(r *simRand) FaultSet {
	var f FaultSet
	for i := range faultKinds {
		if r.chance(2, 3) {
			f |= 1 << i
		}
	}
	return f
}
