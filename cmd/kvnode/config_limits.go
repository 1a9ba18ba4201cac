package main

import (
	"errors"
	"fmt"
	"time"

	"synod/kv/server"
	"synod/kv/space"
	"synod/tenants"
)

// LimitsConfig is the [limits] table: bounds on client connections and
// responses (kv/server, "Limits" in docs/protocol.md). Every key is
// optional; zero or absent takes the default named in the comment.
// Durations are Go duration strings ("5s", "5m").
type LimitsConfig struct {
	// ConnsMax bounds authenticated client connections on this node
	// (default 1024, server.ConnsMaxDefault).
	ConnsMax int `toml:"conns_max"`
	// ConnsPerTenantMax bounds one tenant's authenticated connections
	// (default conns_max / 4). It must be below conns_max, so that one
	// tenant can never hold every slot.
	ConnsPerTenantMax int `toml:"conns_per_tenant_max"`
	// ConnsPerSourceMax bounds the connections from one source address,
	// IPv6 by /64 (default 512). Set it at least conns_per_tenant_max when
	// a tenant's clients share one address (NAT, a proxy).
	ConnsPerSourceMax int `toml:"conns_per_source_max"`
	// ConnsUnauthenticatedMax bounds connections that have not completed
	// HELLO (default 256); past it a new one closes the oldest of them.
	ConnsUnauthenticatedMax int `toml:"conns_unauthenticated_max"`
	// HandshakeTimeout: HELLO must arrive within it of accept (default 5s).
	HandshakeTimeout string `toml:"handshake_timeout"`
	// IdleTimeout closes an authenticated connection with nothing in
	// flight that sends nothing for this long (default 5m).
	IdleTimeout string `toml:"idle_timeout"`
	// FrameTimeout: a frame must arrive whole within it of its first byte
	// (default 10s).
	FrameTimeout string `toml:"frame_timeout"`
	// WriteTimeout closes a connection whose client reads nothing of a
	// burst of answers for this long (default 10s).
	WriteTimeout string `toml:"write_timeout"`
	// ResponseBytesPerConnMax, ResponseBytesPerTenantMax and
	// ResponseBytesPerNodeMax bound the response bytes reserved for
	// requests in flight plus answers not yet written (defaults 8 MiB,
	// 24 MiB, 96 MiB). The tenant's must be below the node's, so that
	// one tenant's unread answers cannot stall the others.
	ResponseBytesPerConnMax   int64 `toml:"response_bytes_per_conn_max"`
	ResponseBytesPerTenantMax int64 `toml:"response_bytes_per_tenant_max"`
	ResponseBytesPerNodeMax   int64 `toml:"response_bytes_per_node_max"`
	// RequestBytesPerConnMax, RequestBytesPerTenantMax and
	// RequestBytesPerNodeMax bound the request body bytes read and not
	// yet answered (kv/server request_budget.go); 0 or absent: defaults.
	RequestBytesPerConnMax   int64 `toml:"request_bytes_per_conn_max"`
	RequestBytesPerTenantMax int64 `toml:"request_bytes_per_tenant_max"`
	RequestBytesPerNodeMax   int64 `toml:"request_bytes_per_node_max"`
	// DiskFreeMinBytes is the free space kept on data_dir's filesystem:
	// below it every write that would grow what a tenant stores is
	// answered NO_SPACE (deletes still pass; kv/space). Absent: 1 GiB
	// (space.DiskFreeMinBytesDefault); 0 turns the check off.
	DiskFreeMinBytes *int64 `toml:"disk_free_min_bytes"`
}

// diskReserveMarginBytes is what a reserve must hold beyond Pebble's
// memtables: the MANIFEST and the tables a flush writes beside them.
const diskReserveMarginBytes = 16 << 20

// validateDiskReserve checks that a reserve covers what Pebble holds in
// memory: writes in the memtables reach the disk after admission checked
// the free space, and a flush or compaction that then fails to write its
// MANIFEST is fatal to Pebble (the node exits; seen on a 192 MiB tmpfs
// with a 48 MiB reserve below 64 MiB of memtables).
func (c *Config) validateDiskReserve() error {
	r := c.Limits.diskFreeMinBytes()
	if r == 0 {
		return nil
	}
	plan, err := c.memoryPlan()
	if err != nil {
		return nil // validateMemory names it
	}
	mem := int64(plan.Pebble.MemTableBytes) * int64(plan.Pebble.MemTables)
	if least := mem + diskReserveMarginBytes; r < least {
		return fmt.Errorf("limits.disk_free_min_bytes: %d is below %d: Pebble's memtables (%d x %d bytes, from the memory budget) reach the disk after the check, plus %d for the flush's own files; set at least %d, or 0 to turn the check off",
			r, least, plan.Pebble.MemTables, plan.Pebble.MemTableBytes, diskReserveMarginBytes, least)
	}
	return nil
}

// diskFreeMinBytes is the effective reserve.
func (c *LimitsConfig) diskFreeMinBytes() int64 {
	if c.DiskFreeMinBytes == nil {
		return space.DiskFreeMinBytesDefault
	}
	return *c.DiskFreeMinBytes
}

// spaceGuard wraps be in the storage admission of kv/space: the tenants'
// quota_bytes and the disk reserve. isLeader reports whether this node
// leads; only the leader checks (followers redirect). membersLow (nil:
// none) names the other members whose disks are below their reserve. Its
// reclaim loop runs on every node (Start).
func (c *Config) spaceGuard(be server.Backend, reg *tenants.Registry, ledger space.Ledger, isLeader func() bool, membersLow func() []space.MemberDisk) *space.Guard {
	return space.New(be, space.Config{Registry: reg, Ledger: ledger, DataDir: c.DataDir,
		DiskFreeMinBytes: c.Limits.diskFreeMinBytes(), IsLeader: isLeader, MembersLow: membersLow})
}

func (c *LimitsConfig) validate() error {
	for _, n := range []struct {
		key string
		v   int64
	}{{"conns_max", int64(c.ConnsMax)}, {"conns_per_tenant_max", int64(c.ConnsPerTenantMax)},
		{"conns_per_source_max", int64(c.ConnsPerSourceMax)}, {"conns_unauthenticated_max", int64(c.ConnsUnauthenticatedMax)},
		{"response_bytes_per_conn_max", c.ResponseBytesPerConnMax}, {"response_bytes_per_tenant_max", c.ResponseBytesPerTenantMax},
		{"response_bytes_per_node_max", c.ResponseBytesPerNodeMax}, {"request_bytes_per_conn_max", c.RequestBytesPerConnMax},
		{"request_bytes_per_tenant_max", c.RequestBytesPerTenantMax}, {"request_bytes_per_node_max", c.RequestBytesPerNodeMax}} {
		if n.v < 0 {
			return fmt.Errorf("limits.%s: %d is negative (0 or absent takes the default)", n.key, n.v)
		}
	}
	if c.DiskFreeMinBytes != nil && *c.DiskFreeMinBytes < 0 {
		return fmt.Errorf("limits.disk_free_min_bytes: %d is negative (0 turns the check off; absent: %d)", *c.DiskFreeMinBytes, int64(space.DiskFreeMinBytesDefault))
	}
	sc, err := c.serverConfig()
	if err != nil {
		return err
	}
	eff := sc.WithDefaults()
	if eff.ConnsPerTenantMax >= eff.ConnsMax {
		return fmt.Errorf("limits.conns_per_tenant_max: %d must be below conns_max (%d), so that one tenant cannot hold every connection slot",
			eff.ConnsPerTenantMax, eff.ConnsMax)
	}
	return nil
}

// validateDerivedLimits checks the client server's configuration as it
// will run: the [limits] table with the budgets it leaves unset derived
// from the memory plan (an explicit node response budget below the
// server's default tenant budget is valid when the derived tenant budget
// is below it). After Limits.validate and validateMemory.
func (c *Config) validateDerivedLimits() error {
	if err := c.clientServerConfig(nil).Validate(); err != nil {
		return fmt.Errorf("limits.%w", err)
	}
	return nil
}

// serverConfig is the kv/server configuration of the table (zero fields
// take the server's defaults); the caller adds the admitter.
func (c *LimitsConfig) serverConfig() (server.Config, error) {
	sc := server.Config{
		ConnsMax: c.ConnsMax, ConnsPerTenantMax: c.ConnsPerTenantMax,
		ConnsPerSourceMax: c.ConnsPerSourceMax, ConnsUnauthenticatedMax: c.ConnsUnauthenticatedMax,
		ResponseBytesPerConnMax: c.ResponseBytesPerConnMax, ResponseBytesPerTenantMax: c.ResponseBytesPerTenantMax,
		ResponseBytesPerNodeMax: c.ResponseBytesPerNodeMax,
		RequestBytesPerConnMax:  c.RequestBytesPerConnMax, RequestBytesPerTenantMax: c.RequestBytesPerTenantMax,
		RequestBytesPerNodeMax: c.RequestBytesPerNodeMax,
	}
	for _, d := range []struct {
		key string
		s   string
		dst *time.Duration
	}{{"handshake_timeout", c.HandshakeTimeout, &sc.HandshakeTimeout}, {"idle_timeout", c.IdleTimeout, &sc.IdleTimeout},
		{"frame_timeout", c.FrameTimeout, &sc.FrameTimeout}, {"write_timeout", c.WriteTimeout, &sc.WriteTimeout}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil || v <= 0 {
			return server.Config{}, fmt.Errorf("limits.%s: %q is not a positive duration", d.key, d.s)
		}
		*d.dst = v
	}
	return sc, nil
}

// clientServerConfig is the client server's configuration: the [limits]
// table (validated by parseConfig) with admitter.
func (c *Config) clientServerConfig(admitter server.Admitter) server.Config {
	sc, err := c.Limits.serverConfig()
	if err != nil {
		panic(errors.Join(errors.New("kvnode: [limits] used before validation"), err))
	}
	sc.Admitter = admitter
	c.requestBudgetsFromMemory(&sc)
	c.responseBudgetsFromMemory(&sc)
	return sc
}

// memoryRequestHeapDivisor: the request budgets the [limits] table leaves
// unset take, node-wide, at most this fraction of the heap's share of the
// memory budget (and never more than the server's defaults). Each body is
// copied about four times on its way into consensus (kv/server
// RequestBytesPerNodeMaxDefault), so bodies and their copies hold at most
// half the heap share. With the server's fixed defaults a 192 MiB budget
// (a 96 MiB heap share) let 48 MiB of megabyte writes in flight, and a
// leader's resident set reached 205-235 MiB (kv/README.md "Memory").
const memoryRequestHeapDivisor = 8

// requestBudgetsFromMemory fills the request budgets the [limits] table
// leaves unset from the memory plan: the node's at most
// HeapLimitBytes/memoryRequestHeapDivisor and the server's default, a
// tenant's half of it and a connection's quarter at most (and the
// server's defaults at most), each at least the largest body and at least
// the level below (the server's order, Validate). Budgets the table sets
// are kept as they are, and when it sets the node's, the levels below
// follow that instead of the plan. With the default budget the result is the
// server's defaults.
func (c *Config) requestBudgetsFromMemory(sc *server.Config) {
	plan, err := c.memoryPlan()
	if err != nil {
		return // validateMemory named it
	}
	node := min(server.RequestBytesPerNodeMaxDefault, max(plan.HeapLimitBytes/memoryRequestHeapDivisor, server.RequestBytesPerConnMin))
	if sc.RequestBytesPerNodeMax != 0 {
		node = sc.RequestBytesPerNodeMax // the levels below follow the operator's node budget
	}
	if sc.RequestBytesPerConnMax == 0 {
		sc.RequestBytesPerConnMax = min(server.RequestBytesPerConnMaxDefault, max(node/4, server.RequestBytesPerConnMin))
	}
	if sc.RequestBytesPerTenantMax == 0 {
		sc.RequestBytesPerTenantMax = max(min(server.RequestBytesPerTenantMaxDefault, node/2), sc.RequestBytesPerConnMax)
	}
	if sc.RequestBytesPerNodeMax == 0 {
		sc.RequestBytesPerNodeMax = max(node, sc.RequestBytesPerTenantMax)
	}
}

// memoryResponseHeapDivisor: the response budgets the [limits] table
// leaves unset take, node-wide, at most this fraction of the heap's share
// of the memory budget (and never more than the server's defaults). An
// answer is held once, in the Go heap, from its read until the client has
// read it, so together with the request budgets' half (above) three
// quarters of the heap share can be in flight. With the server's fixed
// defaults a 192 MiB budget (a 92 MiB heap share) let 96 MiB of answers
// wait for clients that read slowly.
const memoryResponseHeapDivisor = 4

// responseBudgetsFromMemory fills the response budgets the [limits] table
// leaves unset from the memory plan: the node's at most
// HeapLimitBytes/memoryResponseHeapDivisor, a tenant's quarter of it and
// a connection's twelfth (the server's default proportions), and each never
// above the server's default nor below what the server requires (a
// connection's room for the largest SCAN reply; a tenant's room for that
// plus each of its connections' reservation; the node's room for a tenant
// plus each connection's: Validate). Budgets the table sets are kept, and
// the derived levels rise around them to keep that order; when it sets the
// node's, the levels below follow that instead of the plan. With the
// default budget the result is the server's defaults.
//
// A tenant's share is the trade between one tenant's throughput and the
// others' isolation: it takes 1/share tenants whose answers wait unread to
// fill the node, and then every tenant's large answers get THROTTLED. At
// half the node's, two flooding tenants made a third, reading tenant's
// GETs THROTTLED (an outside tester); at a quarter it takes four, but a
// single tenant reading megabyte values on a 192 MiB budget gets 30-45 %
// fewer answers than with the fixed defaults (kv/README.md "Memory").
// Isolation is what this store is for, so the quarter.
func (c *Config) responseBudgetsFromMemory(sc *server.Config) {
	plan, err := c.memoryPlan()
	if err != nil {
		return // validateMemory named it
	}
	d := sc.WithDefaults() // the connection counts the reservations need
	connsReserved := func(conns int) int64 { return int64(conns) * server.ResponseBytesReserved }
	node := min(server.ResponseBytesPerNodeMaxDefault, plan.HeapLimitBytes/memoryResponseHeapDivisor)
	if sc.ResponseBytesPerNodeMax != 0 {
		node = sc.ResponseBytesPerNodeMax
	}
	if sc.ResponseBytesPerConnMax == 0 {
		sc.ResponseBytesPerConnMax = min(server.ResponseBytesPerConnMaxDefault, max(node/12, server.ResponseBytesPerConnMin))
	}
	if sc.ResponseBytesPerTenantMax == 0 {
		sc.ResponseBytesPerTenantMax = max(min(server.ResponseBytesPerTenantMaxDefault, node/4),
			sc.ResponseBytesPerConnMax+connsReserved(d.ConnsPerTenantMax))
	}
	if sc.ResponseBytesPerNodeMax == 0 {
		sc.ResponseBytesPerNodeMax = max(node, sc.ResponseBytesPerTenantMax+connsReserved(d.ConnsMax))
	}
}

// budgetsAboveMemory names each request or response budget the [limits]
// table sets above what the memory plan would give it: with such a
// budget the node's resident set can pass memory.budget_bytes under
// clients that send or leave unread that many bytes (an outside tester:
// response budgets set by hand to 64 / 256 / 512 MiB took a node on a
// 192 MiB budget to 255 MiB, with no word at start). kvnode logs them at
// start; they are the operator's choice, so not an error.
func (c *Config) budgetsAboveMemory() []string {
	plain := *c
	plain.Limits.ResponseBytesPerConnMax, plain.Limits.ResponseBytesPerTenantMax, plain.Limits.ResponseBytesPerNodeMax = 0, 0, 0
	plain.Limits.RequestBytesPerConnMax, plain.Limits.RequestBytesPerTenantMax, plain.Limits.RequestBytesPerNodeMax = 0, 0, 0
	derived := plain.clientServerConfig(nil)
	var over []string
	for _, b := range []struct {
		key          string
		set, derived int64
	}{
		{"response_bytes_per_conn_max", c.Limits.ResponseBytesPerConnMax, derived.ResponseBytesPerConnMax},
		{"response_bytes_per_tenant_max", c.Limits.ResponseBytesPerTenantMax, derived.ResponseBytesPerTenantMax},
		{"response_bytes_per_node_max", c.Limits.ResponseBytesPerNodeMax, derived.ResponseBytesPerNodeMax},
		{"request_bytes_per_conn_max", c.Limits.RequestBytesPerConnMax, derived.RequestBytesPerConnMax},
		{"request_bytes_per_tenant_max", c.Limits.RequestBytesPerTenantMax, derived.RequestBytesPerTenantMax},
		{"request_bytes_per_node_max", c.Limits.RequestBytesPerNodeMax, derived.RequestBytesPerNodeMax},
	} {
		if b.set > b.derived {
			over = append(over, fmt.Sprintf("limits.%s = %d (the memory budget gives it %d)", b.key, b.set, b.derived))
		}
	}
	return over
}
