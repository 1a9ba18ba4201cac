package main

import (
	"math"
	"os"
	"runtime/debug"

	"github.com/rs/zerolog"
)

// gcPercentDefault is the GOGC kvnode runs with when a memory limit is in
// effect and the environment sets no GOGC. The Go default, 100, starts a
// collection each time the heap grows by the live heap, and a node's live
// heap is mostly paxos's copy of the acceptor log (kv/README.md,
// "Memory"): under load the collector ran nearly back to back, its mark
// assists charged to the request goroutines and its stop-the-world pauses
// stretched by a busy machine. 400 collects a fifth as often; the memory
// limit ([memory], config_memory.go) still bounds the heap, the collector
// running as soon as the heap reaches it. docs/benchmarking.md, "Where the
// tail comes from", has the before/after figures.
const gcPercentDefault = 400

// gcPercentLimitMin is the smallest memory limit (GOMEMLIMIT) kvnode sets
// gcPercentDefault under; below it the runtime's GOGC (100) stays. The
// limit is soft: the runtime caps the collector at half the CPU, so on a
// starved machine with GOGC 400 the heap ran past it — a leader serving
// snapshots under load with a 96 MiB limit (the 192 MiB budget of e2e
// TestMemoryBoundedByBudget) reached 198-203 MiB of resident set, 3 runs
// of 3 (E2E_MEM_PAUSE_FOLLOWER=1); with GOGC 100, 161-193 MiB in 4 runs
// (one still 1 MiB over: this narrows the overshoot, it does not remove
// it; kv/README.md "Memory"). A small budget has no room for a heap five
// times the live one between collections.
const gcPercentLimitMin = 256 << 20

// chooseGCPercent returns the GOGC to set, or -1 to leave the runtime's:
// an operator's GOGC in the environment wins, and without a memory limit
// (limit math.MaxInt64: none) a larger GOGC would let the heap grow with
// the live heap unbounded, so the default stays.
func chooseGCPercent(env string, limit int64) int {
	if env != "" || limit == math.MaxInt64 || limit < gcPercentLimitMin {
		return -1
	}
	return gcPercentDefault
}

// applyGCPercent sets GOGC per chooseGCPercent; call it after the memory
// limit is set (applyMemory).
func applyGCPercent(log zerolog.Logger) {
	env := os.Getenv("GOGC")
	pct := chooseGCPercent(env, debug.SetMemoryLimit(-1))
	if pct < 0 {
		log.Info().Str("gogc_env", env).Msg("gc percent left to the runtime")
		return
	}
	debug.SetGCPercent(pct)
	log.Info().Int("gogc", pct).Msg("gc percent")
}
