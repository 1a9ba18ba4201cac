package paxossim

import (
	"flag"
	"fmt"
	"strings"
	"testing"

	"synod/paxos"
)

var (
	flagSeed      = flag.Uint64("seed", 0, "replay this one seed (0: run the batch)")
	flagSeeds     = flag.Int("seeds", 0, "seeds in the batch (0: seedsDefault, or seedsLong with -long)")
	flagFirst     = flag.Uint64("first", 1, "first seed of the batch")
	flagTicks     = flag.Int("ticks", 0, "fault-phase ticks per seed (0: TicksDefault, or ticksLong with -long)")
	flagLong      = flag.Bool("long", false, "a longer run: more seeds, more ticks per seed")
	flagIntensity = flag.Int("intensity", 1, "multiply the rates of crashes, partitions and membership changes")
	flagFaults    = flag.String("faults", "", "comma-separated fault kinds, or all (default: a random profile per seed)")
)

// Batch sizes. seedsDefault keeps the default run within a few minutes on
// two slow shared cores.
const (
	seedsDefault = 2000
	seedsShort   = 200
	seedsLong    = 20000
	ticksLong    = 1000
)

// replayCommand is the exact command that replays one seed with the flags
// this run used.
func replayCommand(seed uint64) string {
	cmd := fmt.Sprintf("go test ./paxos/paxossim -run 'TestSimulation$' -seed=%d", seed)
	if *flagTicks != 0 {
		cmd += fmt.Sprintf(" -ticks=%d", *flagTicks)
	} else if *flagLong {
		cmd += fmt.Sprintf(" -ticks=%d", ticksLong)
	}
	if *flagFaults != "" {
		cmd += fmt.Sprintf(" -faults=%s", *flagFaults)
	}
	if *flagIntensity > 1 {
		cmd += fmt.Sprintf(" -intensity=%d", *flagIntensity)
	}
	return cmd + " -v"
}

func optionsFromFlags(t *testing.T) Options {
	var opts Options
	opts.Ticks = *flagTicks
	opts.Intensity = *flagIntensity
	if opts.Ticks == 0 && *flagLong {
		opts.Ticks = ticksLong
	}
	if *flagFaults != "" {
		f, ok := ParseFaults(*flagFaults)
		if !ok {
			t.Fatalf("bad -faults %q (kinds: %s)", *flagFaults, FaultAll)
		}
		if f == 0 {
			opts.NoFaults = true
		}
		opts.Faults = f
	}
	return opts
}

// TestSimulation runs the seeded simulation: a batch of seeds by default,
// or one seed (with a trace under -v) when -seed is given. Every violation
// fails the test and prints the command that replays its seed.
func TestSimulation(t *testing.T) {
	opts := optionsFromFlags(t)
	if *flagSeed != 0 {
		if testing.Verbose() {
			opts.Trace = func(line string) { t.Log(line) }
		}
		r := Run(*flagSeed, opts)
		t.Log(r.String())
		fmt.Println((&Summary{Seeds: 1, Ops: r.Ops, Faults: r.FaultCount, Violations: r.Violations}).String())
		if r.Failed() {
			t.Fatalf("seed %d: %d violations\n%s\nreplay: %s", r.Seed, r.Violations, r, replayCommand(r.Seed))
		}
		return
	}
	n := *flagSeeds
	if n == 0 {
		switch {
		case *flagLong:
			n = seedsLong
		case testing.Short():
			n = seedsShort
		default:
			n = seedsDefault
		}
	}
	sum := RunBatch(*flagFirst, n, opts, 0, nil)
	fmt.Println(sum.String())
	t.Log(sum.Detail())
	if n >= 100 && opts.Faults == 0 && !opts.NoFaults && sum.Covered != FaultAll {
		t.Errorf("batch covered fault kinds %s, want all of %s", sum.Covered, FaultAll)
	}
	for i, r := range sum.Failed {
		if i == 10 {
			t.Errorf("... and %d more failing seeds", len(sum.Failed)-i)
			break
		}
		t.Errorf("%s\nreplay: %s", r, replayCommand(r.Seed))
	}
	if sum.Ops == 0 {
		t.Errorf("no client operation completed in %d seeds", n)
	}
}

// TestSimulationDeterministic runs the same seeds twice and requires
// identical results: replaying a seed is only useful if it replays.
func TestSimulationDeterministic(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		var a, b []string
		opts := Options{Faults: FaultAll, Trace: func(l string) { a = append(a, l) }}
		r1 := Run(seed, opts)
		opts.Trace = func(l string) { b = append(b, l) }
		r2 := Run(seed, opts)
		if r1.String() != r2.String() || strings.Join(a, "\n") != strings.Join(b, "\n") {
			t.Fatalf("seed %d is not deterministic:\n%s\n%s", seed, r1, r2)
		}
	}
}

// TestNoFaultsMakesProgress is the sanity floor: without faults every seed
// completes most of its client operations.
func TestNoFaultsMakesProgress(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		r := Run(seed, Options{NoFaults: true})
		if r.Failed() {
			t.Fatalf("%s\nreplay: %s", r, replayCommand(seed))
		}
		if r.Ops < r.Calls || r.Ops < 20 {
			t.Fatalf("seed %d: only %d of %d operations completed without faults", seed, r.Ops, r.Calls)
		}
	}
}

// TestHooks checks the event hooks the accel plane will be driven by: every
// delivered message passes OnDeliver, every Ready passes OnReady, and the
// leader's AckEvents show commits.
func TestHooks(t *testing.T) {
	var readies, delivered, committedAcks, committedEntries int
	opts := Options{
		NoFaults: true,
		OnReady: func(node paxos.NodeID, rd *paxos.Ready) {
			readies++
			committedEntries += len(rd.Committed)
			for _, ev := range rd.AckEvents {
				if ev.Committed {
					committedAcks++
				}
			}
		},
		OnDeliver: func(m *paxos.Message) { delivered++ },
	}
	r := Run(7, opts)
	if r.Failed() {
		t.Fatal(r)
	}
	if readies == 0 || uint64(delivered) != r.Net.delivered || committedAcks == 0 || committedEntries == 0 {
		t.Fatalf("readies=%d delivered=%d (network says %d) committed acks=%d entries=%d",
			readies, delivered, r.Net.delivered, committedAcks, committedEntries)
	}
}

// seedsMembershipHeavy is the membership-heavy batch of the default run.
const seedsMembershipHeavy = 500

// TestSimulationMembershipHeavy runs the membership-heavy profile (many
// quick remove/add cycles under partitions, crashes and lost messages), so
// membership bugs fail at the default seed count rather than only at
// thousands of seeds at raised intensity.
func TestSimulationMembershipHeavy(t *testing.T) {
	n := seedsMembershipHeavy
	if testing.Short() {
		n = seedsShort
	}
	sum := RunBatch(1, n, Options{MembershipHeavy: true}, 0, nil)
	fmt.Printf("paxossim membership-heavy: seeds=%d ops=%d conf_changes=%d fresh_nodes=%d joins=%d learners=%d promotions=%d hand_overs=%d/%d at_once=%d violations=%d lease_checks=%d lease_violations=%d quorum_checks=%d quorum_violations=%d\n",
		sum.Seeds, sum.Ops, sum.Counts.ConfChanges, sum.Counts.FreshNodes, sum.Counts.Joins, sum.Counts.Learners, sum.Counts.Promotions,
		sum.Counts.TransfersDone, sum.Counts.Transfers, sum.Counts.TransfersNow, sum.Violations, sum.LeaseChecks, sum.LeaseViolations, sum.QuorumChecks, sum.QuorumViolations)
	t.Log(sum.Detail())
	for i, r := range sum.Failed {
		if i == 10 {
			t.Errorf("... and %d more failing seeds", len(sum.Failed)-i)
			break
		}
		t.Errorf("%s\nreplay: %s", r, replayCommand(r.Seed)+" (with Options.MembershipHeavy)")
	}
	if sum.Counts.ConfChanges < n {
		t.Errorf("only %d membership changes in %d seeds", sum.Counts.ConfChanges, n)
	}
	// Every part of the learner path happened (not only at large seed
	// counts): learners added and promoted, nodes joining by snapshot,
	// leadership handed over.
	if c := sum.Counts; c.Learners == 0 || c.Promotions == 0 || c.Joins == 0 || c.TransfersDone == 0 {
		t.Errorf("learners=%d promotions=%d joins=%d hand-overs done=%d in %d seeds", c.Learners, c.Promotions, c.Joins, c.TransfersDone, n)
	}
}

// simWindowBytes bounds the leader's window to about two of the
// simulator's commands: every leadership runs with a window of one to
// three slots, its successors adopt and re-propose that much.
const simWindowBytes = 96

// TestSimulationSmallWindow: a leader window bounded in bytes
// (Config.InflightBytesMax, what kv/replica sets so that a full acceptor
// log never wedges the group) keeps every oracle, and the group still
// commits under faults and finishes every operation after they heal.
func TestSimulationSmallWindow(t *testing.T) {
	runNarrowed(t, seedsMembershipHeavy, Options{InflightBytesMax: simWindowBytes},
		fmt.Sprintf("small window: window_bytes=%d", simWindowBytes), "Options.InflightBytesMax")
}

// simPipelineSlots is kv/replica's pipeline window (pipelineSlotsMax):
// the simulator runs the fault batch with the window kvnode runs.
const simPipelineSlots = 2

// TestSimulationPipelineSlots: a leader whose pipeline window is a few
// slots (Config.PipelineSlotsMax, what kv/replica sets so that proposals
// made while slots are in flight share the next one) keeps every oracle
// under every fault kind, and finishes every operation after they heal.
func TestSimulationPipelineSlots(t *testing.T) {
	runNarrowed(t, seedsDefault, Options{PipelineSlotsMax: simPipelineSlots},
		fmt.Sprintf("pipeline window: pipeline_slots=%d", simPipelineSlots), "Options.PipelineSlotsMax")
}

// runNarrowed runs n seeds (seedsShort under -short) of the default fault
// batch with opts narrowing the leader's window, prints a summary line
// named by what, and fails for every violation (its replay names option)
// or when the operations finished are fewer than the seeds.
func runNarrowed(t *testing.T, n int, opts Options, what, option string) {
	t.Helper()
	if testing.Short() {
		n = seedsShort
	}
	sum := RunBatch(1, n, opts, 0, nil)
	fmt.Printf("paxossim %s seeds=%d ops=%d violations=%d lease_checks=%d lease_violations=%d\n",
		what, sum.Seeds, sum.Ops, sum.Violations, sum.LeaseChecks, sum.LeaseViolations)
	for i, r := range sum.Failed {
		if i == 10 {
			t.Errorf("... and %d more failing seeds", len(sum.Failed)-i)
			break
		}
		t.Errorf("%s\nreplay: %s", r, replayCommand(r.Seed)+" (with "+option+")")
	}
	if sum.Ops < n {
		t.Errorf("only %d operations in %d seeds", sum.Ops, n)
	}
}
