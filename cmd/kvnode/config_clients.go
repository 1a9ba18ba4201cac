package main

import (
	"fmt"

	"synod/kv/sm"
	"synod/tenants"
)

// clientShares returns every tenant's share of the state machine's
// exactly-once client table ([[tenants]] clients_max; kv/sm, "Exactly-once"
// in docs/protocol.md). A tenant without clients_max gets the default
// share: sm.ClientsPerTenantDefault (1024), or less when there are many
// tenants, so that all the shares together stay within sm.ClientsTotalMax
// (16384): then what the explicit shares leave is split evenly among the
// others. The shares decide which writes the state machine applies, so
// every replica must derive the same ones: keep clients_max and the tenant
// list the same on every node.
func (c *Config) clientShares() (map[tenants.ID]int, error) {
	shares := make(map[tenants.ID]int, len(c.Tenants))
	explicit, implicit := 0, 0
	for i, t := range c.Tenants {
		if t.ClientsMax == 0 {
			implicit++
			continue
		}
		if t.ClientsMax < sm.ClientsPerTenantMin || t.ClientsMax > sm.ClientsPerTenantMax {
			return nil, fmt.Errorf("tenants[%d].clients_max: %d is outside %d..%d", i, t.ClientsMax, sm.ClientsPerTenantMin, sm.ClientsPerTenantMax)
		}
		explicit += t.ClientsMax
		shares[tenants.ID(t.ID)] = t.ClientsMax
	}
	if explicit > sm.ClientsTotalMax {
		return nil, fmt.Errorf("tenants.clients_max: the shares add up to %d, more than the table's %d", explicit, sm.ClientsTotalMax)
	}
	if implicit == 0 {
		return shares, nil
	}
	def := min(sm.ClientsPerTenantDefault, (sm.ClientsTotalMax-explicit)/implicit)
	if def < sm.ClientsPerTenantMin {
		return nil, fmt.Errorf("tenants.clients_max: the explicit shares (%d in all) leave %d of the table's %d for %d tenants without clients_max, below %d each",
			explicit, sm.ClientsTotalMax-explicit, sm.ClientsTotalMax, implicit, sm.ClientsPerTenantMin)
	}
	for _, t := range c.Tenants {
		if t.ClientsMax == 0 {
			shares[tenants.ID(t.ID)] = def
		}
	}
	return shares, nil
}

// smOptions are the state machine's options from the config (valid after
// parseConfig).
func (c *Config) smOptions() sm.Options {
	shares, _ := c.clientShares()
	// Pebble's errors and write stalls reach the node's log (they were
	// discarded: a full disk wedged every write without a line).
	pl := newLogger(c).With().Str("loop", "pebble").Logger()
	o := sm.Options{ClientsMax: shares, Log: &pl}
	if plan, err := c.memoryPlan(); err == nil { // validated by parseConfig
		plan.applySM(&o) // Pebble's share of [memory] (config_memory.go)
	}
	return o
}
