// Command paxossim runs the paxos simulator outside the test harness: a
// batch of seeds, or one seed with a trace.
//
//	paxossim -seeds 2000            # a batch, prints the summary line
//	paxossim -seed 12345 -trace     # replay one seed with its event trace
package main

import (
	"flag"
	"fmt"
	"os"

	"synod/paxos/paxossim"
)

func main() {
	seed := flag.Uint64("seed", 0, "run this one seed (0: run a batch)")
	first := flag.Uint64("first", 1, "first seed of the batch")
	seeds := flag.Int("seeds", 2000, "seeds in the batch")
	ticks := flag.Int("ticks", 0, "fault-phase ticks per seed (0: default)")
	faults := flag.String("faults", "", "comma-separated fault kinds, or all (default: random per seed)")
	trace := flag.Bool("trace", false, "print the event trace of a single seed")
	intensity := flag.Int("intensity", 1, "multiply the rates of crashes, partitions and membership changes")
	workers := flag.Int("workers", 0, "parallel runs (0: GOMAXPROCS)")
	verbose := flag.Bool("v", false, "print every run's result line")
	flag.Parse()

	opts := paxossim.Options{Ticks: *ticks, Intensity: *intensity}
	if *faults != "" {
		f, ok := paxossim.ParseFaults(*faults)
		if !ok {
			fmt.Fprintf(os.Stderr, "paxossim: bad -faults %q (kinds: %s)\n", *faults, paxossim.FaultAll)
			os.Exit(2)
		}
		opts.Faults = f
		opts.NoFaults = f == 0
	}
	if *seed != 0 {
		if *trace {
			opts.Trace = func(line string) { fmt.Println(line) }
		}
		r := paxossim.Run(*seed, opts)
		fmt.Println(r)
		s := paxossim.Summary{Seeds: 1, Ops: r.Ops, Faults: r.FaultCount, Violations: r.Violations}
		fmt.Println(s.String())
		if r.Failed() {
			os.Exit(1)
		}
		return
	}
	sum := paxossim.RunBatch(*first, *seeds, opts, *workers, func(r *paxossim.Result) {
		if *verbose || r.Failed() {
			fmt.Println(r)
		}
		if r.Failed() {
			fmt.Printf("replay: go run ./paxos/paxossim/cmd/paxossim -seed=%d -trace", r.Seed)
			if *ticks != 0 {
				fmt.Printf(" -ticks=%d", *ticks)
			}
			if *faults != "" {
				fmt.Printf(" -faults=%s", *faults)
			}
			if *intensity > 1 {
				fmt.Printf(" -intensity=%d", *intensity)
			}
			fmt.Println()
		}
	})
	fmt.Println(sum.Detail())
	fmt.Println(sum.String())
	if sum.Violations > 0 {
		os.Exit(1)
	}
}
