package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/rs/zerolog"

	"synod/internal/cmalloc"
	"synod/kv/sm"
)

// MemoryConfig is the [memory] table: the node's memory budget. kvnode
// splits it among the consumers whose size it decides (memoryPlan), so
// that the node's resident memory stays within it whatever the size of
// the data: the whole list, with each consumer's bound, is "Memory" in
// kv/README.md (with what was measured where the bound broke).
type MemoryConfig struct {
	// BudgetBytes bounds the node's resident set. It must hold the
	// acceptor log's mapping, paxos's copy of the accepted entries
	// (memoryLogHeapPercent of pmem.size_bytes), the fixed process and
	// heap needs and Pebble's minimum: a smaller one is a config error
	// that names the key and the minimum. Absent (or 0): the larger of
	// memoryBudgetBytesDefault and that minimum plus
	// memoryDefaultSurplusBytes, so that a config written before the key
	// existed, with a large log, still starts.
	BudgetBytes int64 `toml:"budget_bytes"`
}

// The split of the budget.
const (
	// memoryBudgetBytesDefault is budget_bytes when the table does not set
	// it and the log is small enough: the example's 256 MiB acceptor log
	// needs 780 MiB, Pebble's cache gets 130 MiB and 49 read slots
	// 52 MiB.
	memoryBudgetBytesDefault = 1 << 30
	// memoryDefaultSurplusBytes is what an absent budget_bytes grants
	// beyond the minimum when the log is too large for
	// memoryBudgetBytesDefault (half of it to Pebble's cache).
	memoryDefaultSurplusBytes = 128 << 20
	// memoryBudgetBytesMax bounds budget_bytes: 1 PiB, far above any
	// machine, and far enough below 2^63 that the plan's percentages of
	// it cannot overflow (2^58 did: a negative Pebble share).
	memoryBudgetBytesMax = 1 << 50
	// memoryProcessBytes is what the process holds outside the Go
	// runtime's memory, Pebble's manual memory and the log mapping: the
	// binary's mapped text and data (a kvnode maps about 21 MiB of its
	// file at rest), C allocator overhead and thread stacks.
	memoryProcessBytes = 40 << 20
	// memoryHeapBaseBytes is the Go heap a serving node needs besides its
	// copy of the acceptor log: connections, queues, the client table of
	// the active clients, snapshot chunks in flight, the state machine's
	// remembered value lengths (5 MiB at most: kv/sm value_lens.go and
	// apply_lens.go), GC headroom.
	memoryHeapBaseBytes = 64 << 20
	// memoryLogHeapPercent: paxos keeps every entry accepted since the
	// last compaction in the Go heap too, up to what the log holds (it is
	// truncated together with it), plus per-entry and per-command
	// overhead; the heap reserves this share of pmem.size_bytes for it.
	memoryLogHeapPercent = 150
	// memoryReadPinSurplusPercent: of what the budget leaves beyond every
	// minimum, this share (up to sm.ReadSlotsMax slots) goes to the blocks
	// client reads pin beyond Pebble's cache (kv/sm read_slots.go), on top
	// of sm.ReadSlotsMin slots' worth that every plan reserves.
	memoryReadPinSurplusPercent = 20
	// memoryPebbleSurplusPercent: of what the budget leaves beyond every
	// minimum and the reads' share, this share goes to Pebble's cache,
	// the rest to the heap.
	memoryPebbleSurplusPercent = 50
)

// memoryPlan is the budget's split; its parts add up to Budget.
type memoryPlan struct {
	Budget int64
	// LogMapBytes is the acceptor log's mapping (pmem.size_bytes; 0 on
	// the raft path): once the ring wraps every page of it is resident.
	LogMapBytes int64
	// ProcessBytes is memoryProcessBytes.
	ProcessBytes int64
	// Pebble is the state machine's Pebble memory (cache, which its
	// memtables are reserved from): Pebble.Bound() bytes.
	Pebble sm.PebbleMemory
	// ReadSlots bounds the client reads inside Pebble at once, and
	// ReadPinBytes (ReadSlots*sm.ReadSlotPinBytes) is what the blocks they
	// pin beyond the cache may take.
	ReadSlots    int
	ReadPinBytes int64
	// HeapLimitBytes is the Go runtime's memory limit (GOMEMLIMIT):
	// at least HeapNeedBytes.
	HeapLimitBytes int64
	HeapNeedBytes  int64
}

// memoryPlan splits the budget (budget_bytes, or its default when absent):
// the log mapping and the process overhead first, the heap's need
// (memoryHeapBaseBytes plus memoryLogHeapPercent of the log), Pebble's
// minimum and the least read slots' pinned blocks next; of what is left,
// memoryReadPinSurplusPercent to more read slots (up to sm.ReadSlotsMax),
// and the rest half to Pebble's cache, half to the heap. A budget below
// the sum of the minima is an error naming memory.budget_bytes.
func (c *Config) memoryPlan() (memoryPlan, error) {
	p := memoryPlan{Budget: c.Memory.BudgetBytes, ProcessBytes: memoryProcessBytes}
	if c.Replication != "raft" {
		p.LogMapBytes = c.PMem.SizeBytes
	}
	p.HeapNeedBytes = memoryHeapBaseBytes + p.LogMapBytes*memoryLogHeapPercent/100
	readPinMin := int64(sm.ReadSlotsMin) * sm.ReadSlotPinBytes
	least := p.LogMapBytes + p.ProcessBytes + p.HeapNeedBytes + sm.PebbleBytesMin + readPinMin
	if p.Budget == 0 {
		p.Budget = max(memoryBudgetBytesDefault, least+memoryDefaultSurplusBytes)
	}
	if p.Budget < least {
		return memoryPlan{}, fmt.Errorf("memory.budget_bytes: %d is too small to run this node: it needs at least %d "+
			"(%d of acceptor log mapping, pmem.size_bytes; %d of heap for paxos's copy of that log and the rest of the Go heap; "+
			"%d of process overhead; %d for Pebble's cache and memtables; %d for the blocks of %d reads in progress)",
			p.Budget, least, p.LogMapBytes, p.HeapNeedBytes, p.ProcessBytes, sm.PebbleBytesMin, readPinMin, sm.ReadSlotsMin)
	}
	surplus := p.Budget - least
	p.ReadSlots = sm.ReadSlotsFor(readPinMin + surplus*memoryReadPinSurplusPercent/100)
	p.ReadPinBytes = int64(p.ReadSlots) * sm.ReadSlotPinBytes
	surplus -= p.ReadPinBytes - readPinMin
	pebbleBytes := sm.PebbleBytesMin + surplus*memoryPebbleSurplusPercent/100
	pm, err := sm.PebbleMemoryFor(pebbleBytes)
	if err != nil {
		return memoryPlan{}, fmt.Errorf("memory.budget_bytes: %w", err)
	}
	p.Pebble = pm
	p.HeapLimitBytes = p.Budget - p.LogMapBytes - p.ProcessBytes - pm.Bound() - p.ReadPinBytes
	return p, nil
}

// validateMemory checks the [memory] table.
func (c *Config) validateMemory() error {
	if c.Memory.BudgetBytes < 0 {
		return fmt.Errorf("memory.budget_bytes: %d is negative (0 or absent takes the default %d)", c.Memory.BudgetBytes, memoryBudgetBytesDefault)
	}
	if c.Memory.BudgetBytes > memoryBudgetBytesMax {
		return fmt.Errorf("memory.budget_bytes: %d is above %d (1 PiB)", c.Memory.BudgetBytes, int64(memoryBudgetBytesMax))
	}
	_, err := c.memoryPlan()
	return err
}

// applySM sets the state machine's Pebble memory from the plan.
func (p memoryPlan) applySM(o *sm.Options) {
	o.CacheBytes, o.MemTableBytes, o.MemTables = p.Pebble.CacheBytes, p.Pebble.MemTableBytes, p.Pebble.MemTables
	o.ReadSlots = p.ReadSlots
}

// applyMemory applies the plan's runtime part (the state machine's part
// goes through smOptions). The config is valid (parseConfig).
func (c *Config) applyMemory(log zerolog.Logger) {
	if plan, err := c.memoryPlan(); err == nil {
		plan.applyRuntime(log)
	}
	if over := c.budgetsAboveMemory(); len(over) > 0 {
		log.Warn().Strs("budgets", over).Int64("budget_bytes", c.Memory.BudgetBytes).
			Msg("request or response budgets set above what the memory budget gives them: the node's memory can pass memory.budget_bytes under clients that send or leave unread that many bytes")
	}
	// Pebble's share is C malloc; glibc's defaults keep freed memory
	// resident beyond it, so linking internal/cmalloc tuned the
	// allocator when the process was loaded: log what it did.
	switch changed, err := cmalloc.Tune(); {
	case err != nil:
		log.Warn().Err(err).Msg("C allocator left untuned")
	case changed:
		log.Info().Int("arenas_max", cmalloc.ArenasMax).Int("mmap_threshold_bytes", cmalloc.MmapThresholdBytes).Msg("C allocator tuned")
	}
}

// applyRuntime sets the Go runtime's memory limit to the heap's share,
// unless the GOMEMLIMIT environment variable set one (an operator's
// explicit choice wins; it is logged either way).
func (p memoryPlan) applyRuntime(log zerolog.Logger) {
	ev := log.Info().Int64("budget_bytes", p.Budget).Int64("log_map_bytes", p.LogMapBytes).
		Int64("pebble_cache_bytes", p.Pebble.CacheBytes).Uint64("memtable_bytes", p.Pebble.MemTableBytes).
		Int("memtables", p.Pebble.MemTables).Int("read_slots", p.ReadSlots).Int64("read_pin_bytes", p.ReadPinBytes).
		Int64("process_bytes", p.ProcessBytes)
	if env := os.Getenv("GOMEMLIMIT"); env != "" {
		ev.Str("gomemlimit", env+" (from the environment)").Msg("memory budget")
		return
	}
	debug.SetMemoryLimit(p.HeapLimitBytes)
	ev.Int64("gomemlimit_bytes", p.HeapLimitBytes).Msg("memory budget")
}
