package main

import (
	"fmt"
	"strings"
	"testing"

	"synod/kv/sm"
)

// memoryConfig is the example config with pmem.size_bytes set to pmem
// and a [memory] table of body.
func memoryConfig(t *testing.T, pmem int64, body string) []byte {
	t.Helper()
	base := readExample(t)
	const line = "size_bytes = 268435456"
	if !strings.Contains(base, line) {
		t.Fatalf("the example config has no %q line", line)
	}
	base = strings.Replace(base, line, fmt.Sprintf("size_bytes = %d", pmem), 1)
	return []byte(base + "\n[memory]\n" + body)
}

// TestMemoryPlanWithinBudget: for every budget from the least a log needs
// up, the parts of the plan add up to the budget exactly, each is at least
// its minimum, and what the state machine is given is what the plan says.
func TestMemoryPlanWithinBudget(t *testing.T) {
	for _, pmem := range []int64{pmemSizeBytesMin + 4<<10, 16 << 20, 64 << 20, 256 << 20, 1 << 30} {
		least := pmem + memoryProcessBytes + memoryHeapBaseBytes + pmem*memoryLogHeapPercent/100 + sm.PebbleBytesMin + sm.ReadSlotsMin*sm.ReadSlotPinBytes
		for _, budget := range []int64{least, least + 1, least + 7<<20 + 3, 2 * least, 64 << 30} {
			c, err := parseConfig(memoryConfig(t, pmem, fmt.Sprintf("budget_bytes = %d\n", budget)))
			if err != nil {
				t.Fatalf("pmem %d budget %d: %v", pmem, budget, err)
			}
			p, err := c.memoryPlan()
			if err != nil {
				t.Fatal(err)
			}
			sum := p.LogMapBytes + p.ProcessBytes + p.Pebble.Bound() + p.ReadPinBytes + p.HeapLimitBytes
			switch {
			case sum != budget || p.Budget != budget:
				t.Fatalf("pmem %d budget %d: parts add up to %d (%+v)", pmem, budget, sum, p)
			case p.LogMapBytes != pmem:
				t.Fatalf("pmem %d: log mapping counted as %d", pmem, p.LogMapBytes)
			case p.HeapLimitBytes < p.HeapNeedBytes || p.HeapNeedBytes < pmem:
				t.Fatalf("pmem %d budget %d: heap limit %d below its need %d", pmem, budget, p.HeapLimitBytes, p.HeapNeedBytes)
			case p.Pebble.CacheBytes < sm.PebbleBytesMin:
				t.Fatalf("pmem %d budget %d: Pebble cache %d below its minimum", pmem, budget, p.Pebble.CacheBytes)
			case p.ReadSlots < sm.ReadSlotsMin || p.ReadSlots > sm.ReadSlotsMax || p.ReadPinBytes != int64(p.ReadSlots)*sm.ReadSlotPinBytes:
				t.Fatalf("pmem %d budget %d: %d read slots reserve %d bytes", pmem, budget, p.ReadSlots, p.ReadPinBytes)
			case budget == least && p.ReadSlots != sm.ReadSlotsMin:
				t.Fatalf("pmem %d: the least budget has %d read slots, want %d", pmem, p.ReadSlots, sm.ReadSlotsMin)
			case budget == 64<<30 && p.ReadSlots != sm.ReadSlotsMax:
				t.Fatalf("pmem %d: a 64 GiB budget has %d read slots, want %d", pmem, p.ReadSlots, sm.ReadSlotsMax)
			}
			o := c.smOptions()
			if o.CacheBytes != p.Pebble.CacheBytes || o.MemTableBytes != p.Pebble.MemTableBytes || o.MemTables != p.Pebble.MemTables || o.ReadSlots != p.ReadSlots {
				t.Fatalf("state machine options %+v, plan %+v", o, p.Pebble)
			}
		}
	}
	// Absent: the default budget, which the example's 256 MiB log fits.
	c, err := parseConfig([]byte(readExample(t)))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := c.memoryPlan(); err != nil || p.Budget != memoryBudgetBytesDefault {
		t.Fatalf("default plan %+v, %v", p, err)
	}
	// Absent, with a log too large for the default: the least that log
	// needs plus memoryDefaultSurplusBytes (a config written before
	// [memory] existed still starts).
	big, err := parseConfig(memoryConfig(t, 1<<30, ""))
	if err != nil {
		t.Fatalf("absent budget with a 1 GiB log: %v", err)
	}
	bigLeast := int64(1<<30) + memoryProcessBytes + memoryHeapBaseBytes + (1<<30)*memoryLogHeapPercent/100 + sm.PebbleBytesMin + sm.ReadSlotsMin*sm.ReadSlotPinBytes
	if p, err := big.memoryPlan(); err != nil || p.Budget != bigLeast+memoryDefaultSurplusBytes {
		t.Fatalf("default plan for a 1 GiB log %+v, %v; want a budget of %d", p, err, bigLeast+memoryDefaultSurplusBytes)
	}
	// The raft path maps no acceptor log.
	c.Replication = "raft"
	if p, err := c.memoryPlan(); err != nil || p.LogMapBytes != 0 {
		t.Fatalf("raft plan %+v, %v", p, err)
	}
}

// TestMemoryBudgetInvalid: a budget too small to run, a negative one and
// an unknown key are config errors that name the key.
func TestMemoryBudgetInvalid(t *testing.T) {
	const pmem = 64 << 20
	least := pmem + memoryProcessBytes + memoryHeapBaseBytes + pmem*memoryLogHeapPercent/100 + sm.PebbleBytesMin + sm.ReadSlotsMin*sm.ReadSlotPinBytes
	for _, tc := range []struct {
		pmem       int64
		body, want string
	}{
		{pmem, fmt.Sprintf("budget_bytes = %d\n", least-1), "memory.budget_bytes"},
		{pmem, fmt.Sprintf("budget_bytes = %d\n", 64<<20), fmt.Sprintf("needs at least %d", least)},
		{pmem, "budget_bytes = -1\n", "memory.budget_bytes"},
		{pmem, fmt.Sprintf("budget_bytes = %d\n", int64(memoryBudgetBytesMax)+1), "memory.budget_bytes: 1125899906842625 is above"},
		{pmem, "budget_bytes = 9223372036854775807\n", "memory.budget_bytes"},
		{pmem, "budget_byte = 1073741824\n", "memory.budget_byte"},
		{pmem, "cache_bytes = 1073741824\n", "memory.cache_bytes"},
		// An explicit 1 GiB budget cannot hold a 1 GiB log.
		{1 << 30, "budget_bytes = 1073741824\n", "memory.budget_bytes"},
	} {
		_, err := parseConfig(memoryConfig(t, tc.pmem, tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pmem %d, %q: want an error naming %q, got %v", tc.pmem, tc.body, tc.want, err)
		}
	}
	if _, err := parseConfig(memoryConfig(t, pmem, fmt.Sprintf("budget_bytes = %d\n", least))); err != nil {
		t.Fatalf("the least budget was refused: %v", err)
	}
	// The largest budget plans without overflow.
	c, err := parseConfig(memoryConfig(t, pmem, fmt.Sprintf("budget_bytes = %d\n", int64(memoryBudgetBytesMax))))
	if err != nil {
		t.Fatalf("the largest budget was refused: %v", err)
	}
	if p, err := c.memoryPlan(); err != nil || p.Pebble.CacheBytes <= 0 || p.HeapLimitBytes < p.HeapNeedBytes ||
		p.LogMapBytes+p.ProcessBytes+p.Pebble.Bound()+p.ReadPinBytes+p.HeapLimitBytes != memoryBudgetBytesMax {
		t.Fatalf("the largest budget's plan %+v, %v", p, err)
	}
}
