package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"synod/kv/server"
	"synod/kv/space"
)

// limitsConfig is the example config with a [limits] table of body.
func limitsConfig(t *testing.T, body string) []byte {
	return []byte(readExample(t) + "\n[limits]\n" + body)
}

func TestLimitsParse(t *testing.T) {
	c, err := parseConfig(limitsConfig(t, `conns_max = 2000
conns_per_tenant_max = 100
conns_per_source_max = 300
conns_unauthenticated_max = 64
handshake_timeout = "2s"
idle_timeout = "90s"
frame_timeout = "3s"
write_timeout = "4s"
response_bytes_per_conn_max = 8388608
response_bytes_per_tenant_max = 33554432
response_bytes_per_node_max = 134217728
`))
	if err != nil {
		t.Fatal(err)
	}
	got := c.clientServerConfig(nil)
	want := server.Config{ConnsMax: 2000, ConnsPerTenantMax: 100, ConnsPerSourceMax: 300, ConnsUnauthenticatedMax: 64,
		HandshakeTimeout: 2 * time.Second, IdleTimeout: 90 * time.Second, FrameTimeout: 3 * time.Second, WriteTimeout: 4 * time.Second,
		ResponseBytesPerConnMax: 8 << 20, ResponseBytesPerTenantMax: 32 << 20, ResponseBytesPerNodeMax: 128 << 20,
		// The example's memory budget leaves the server's request defaults.
		RequestBytesPerConnMax: server.RequestBytesPerConnMaxDefault, RequestBytesPerTenantMax: server.RequestBytesPerTenantMaxDefault,
		RequestBytesPerNodeMax: server.RequestBytesPerNodeMaxDefault}
	if got != want {
		t.Fatalf("server config\n got %+v\nwant %+v", got, want)
	}
	// Absent: every field zero, which the server reads as its defaults.
	c, err = parseConfig([]byte(readExample(t)))
	if err != nil {
		t.Fatal(err)
	}
	if d := c.clientServerConfig(nil).WithDefaults(); d.ConnsPerTenantMax >= d.ConnsMax || d.IdleTimeout != server.IdleTimeoutDefault {
		t.Fatalf("defaults: %+v", d)
	}
}

func TestLimitsInvalid(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"conns_maxx = 5\n", "limits.conns_maxx"},
		{"conns_max = 100\nconns_per_tenant_max = 100\n", "limits.conns_per_tenant_max"},
		{"conns_max = 1\n", "limits.conns_per_tenant_max"}, // the default per-tenant cap (1) is not below it
		{"conns_per_source_max = -1\n", "limits.conns_per_source_max"},
		{"idle_timeout = \"soon\"\n", "limits.idle_timeout"},
		{"idle_timeout = \"-5s\"\n", "limits.idle_timeout"},
		{"frame_timeout = \"1ms\"\n", "limits.frame_timeout"},
		{"response_bytes_per_conn_max = 1048576\n", "limits.response_bytes_per_conn_max"},
		{"response_bytes_per_tenant_max = 300000000\nresponse_bytes_per_node_max = 200000000\n", "limits.response_bytes_per_node_max"},
		{"disk_free_min_bytes = -1\n", "limits.disk_free_min_bytes: -1 is negative"},
		// Below the example's memtables (2 x 8 MiB) + 16 MiB.
		{"disk_free_min_bytes = 33554431\n", "limits.disk_free_min_bytes: 33554431 is below 33554432"},
		{"disk_free_min_bytes = \"1G\"\n", "line"}, // the decoder names the line and column
	} {
		_, err := parseConfig(limitsConfig(t, tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: want an error naming %s, got %v", tc.body, tc.want, err)
		}
	}
}

// TestDiskFreeMinBytes: absent is space.DiskFreeMinBytesDefault (1 GiB,
// as README and the example say), 0 is off, a value is kept.
func TestDiskFreeMinBytes(t *testing.T) {
	for _, tc := range []struct {
		body string
		want int64
	}{{"", 1 << 30}, {"disk_free_min_bytes = 0\n", 0}, {"disk_free_min_bytes = 50000000\n", 50000000}, {"disk_free_min_bytes = 33554432\n", 33554432}} {
		c, err := parseConfig(limitsConfig(t, tc.body))
		if err != nil {
			t.Fatalf("%q: %v", tc.body, err)
		}
		if got := c.Limits.diskFreeMinBytes(); got != tc.want {
			t.Fatalf("%q: reserve %d, want %d", tc.body, got, tc.want)
		}
	}
	if space.DiskFreeMinBytesDefault != 1<<30 {
		t.Fatal("the default changed: README and examples/kvnode.toml say 1 GiB")
	}
}

// TestTenantLimitsNamed: a negative tenant limit is an error naming the
// key (it was "negative limit or weight above 1000").
func TestTenantLimitsNamed(t *testing.T) {
	base := readExample(t)
	for _, key := range []string{"quota_bytes", "ops_per_sec", "bytes_burst"} {
		cfg := strings.Replace(base, "priority = \"standard\"\n", "priority = \"standard\"\n"+key+" = -1\n", 1)
		cfg = strings.Replace(cfg, "ops_per_sec = 0\n", "", 1)
		cfg = strings.Replace(cfg, "bytes_burst = 0\n", "", 1)
		_, err := parseConfig([]byte(cfg))
		if err == nil || !strings.Contains(err.Error(), "tenants[0]."+key+": -1 is negative") {
			t.Errorf("%s = -1: %v", key, err)
		}
	}
}

// TestRequestBudgetsFromMemory: request budgets the [limits] table leaves
// unset follow the memory budget's heap share (a small budget, small
// budgets: megabyte writes in flight took a 192 MiB node to 205-235 MiB
// with the fixed defaults), never above the server's defaults; budgets the
// table sets are kept, and the derived ones keep the server's order
// around them.
func TestRequestBudgetsFromMemory(t *testing.T) {
	small := "\n[memory]\nbudget_bytes = 201326592\n" // 192 MiB
	withLog := func(extra string) *Config {
		t.Helper()
		c, err := parseConfig([]byte(strings.Replace(readExample(t), "size_bytes = 268435456", "size_bytes = 16777216", 1) + extra))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := withLog(small)
	plan, err := c.memoryPlan()
	if err != nil {
		t.Fatal(err)
	}
	got := c.clientServerConfig(nil)
	node := plan.HeapLimitBytes / memoryRequestHeapDivisor
	if got.RequestBytesPerNodeMax != node || got.RequestBytesPerTenantMax != node/2 || got.RequestBytesPerConnMax != node/4 {
		t.Fatalf("192 MiB budget (heap share %d): request budgets conn/tenant/node %d/%d/%d, want %d/%d/%d",
			plan.HeapLimitBytes, got.RequestBytesPerConnMax, got.RequestBytesPerTenantMax, got.RequestBytesPerNodeMax, node/4, node/2, node)
	}
	if node >= server.RequestBytesPerNodeMaxDefault {
		t.Fatalf("the small budget's derived node budget %d is not below the default", node)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
	// An explicit connection budget above the derived tenant one: the
	// derived levels rise to keep the order.
	c = withLog(small + "\n[limits]\nrequest_bytes_per_conn_max = 8388608\n")
	got = c.clientServerConfig(nil)
	if got.RequestBytesPerConnMax != 8<<20 || got.RequestBytesPerTenantMax != 8<<20 || got.RequestBytesPerNodeMax != max(node, 8<<20) {
		t.Fatalf("explicit conn budget: %d/%d/%d", got.RequestBytesPerConnMax, got.RequestBytesPerTenantMax, got.RequestBytesPerNodeMax)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
	// Explicit budgets are kept whatever the memory budget.
	// Explicit budgets are kept whatever the memory budget, and the
	// levels below an explicit node budget follow it, not the plan.
	c = withLog(small + "\n[limits]\nrequest_bytes_per_node_max = 100000000\n")
	got = c.clientServerConfig(nil)
	if got.RequestBytesPerNodeMax != 100000000 || got.RequestBytesPerTenantMax != server.RequestBytesPerTenantMaxDefault ||
		got.RequestBytesPerConnMax != server.RequestBytesPerConnMaxDefault {
		t.Fatalf("explicit node budget: %d/%d/%d", got.RequestBytesPerConnMax, got.RequestBytesPerTenantMax, got.RequestBytesPerNodeMax)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestResponseBudgetsFromMemory: response budgets the [limits] table
// leaves unset follow the heap's share of the memory budget (the node's a
// quarter of it at most, a tenant's quarter and a connection's twelfth of that), the
// default budget keeps the server's defaults, explicit budgets are kept
// with the derived levels around them in Validate's order, and every
// result is a configuration the server accepts.
func TestResponseBudgetsFromMemory(t *testing.T) {
	withLog := func(pmem int64, extra string) *Config {
		t.Helper()
		c, err := parseConfig([]byte(strings.Replace(readExample(t), "size_bytes = 268435456", fmt.Sprintf("size_bytes = %d", pmem), 1) + extra))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	budgets := func(sc server.Config) [3]int64 {
		return [3]int64{sc.ResponseBytesPerConnMax, sc.ResponseBytesPerTenantMax, sc.ResponseBytesPerNodeMax}
	}
	check := func(name string, c *Config, want [3]int64) {
		t.Helper()
		got := c.clientServerConfig(nil)
		if budgets(got) != want {
			t.Errorf("%s: response budgets conn/tenant/node %v, want %v", name, budgets(got), want)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	defaults := [3]int64{server.ResponseBytesPerConnMaxDefault, server.ResponseBytesPerTenantMaxDefault, server.ResponseBytesPerNodeMaxDefault}
	check("default budget, 256 MiB log", withLog(256<<20, ""), defaults)

	small := "\n[memory]\nbudget_bytes = 201326592\n" // 192 MiB
	c := withLog(16<<20, small)
	plan, err := c.memoryPlan()
	if err != nil {
		t.Fatal(err)
	}
	node := plan.HeapLimitBytes / memoryResponseHeapDivisor
	d := c.clientServerConfig(nil).WithDefaults()
	conn := int64(server.ResponseBytesPerConnMin) // node/12 is below it
	if node/12 >= conn || node >= server.ResponseBytesPerNodeMaxDefault {
		t.Fatalf("the 192 MiB budget's node response budget %d does not exercise the floors", node)
	}
	tenant := max(node/4, conn+int64(d.ConnsPerTenantMax)*server.ResponseBytesReserved)
	check("192 MiB budget", c, [3]int64{conn, tenant, max(node, tenant+int64(d.ConnsMax)*server.ResponseBytesReserved)})

	// An explicit connection budget above the derived tenant one: the
	// levels above rise to keep Validate's order.
	c = withLog(16<<20, small+"\n[limits]\nresponse_bytes_per_conn_max = 20000000\n")
	wantTenant := int64(20000000) + int64(d.ConnsPerTenantMax)*server.ResponseBytesReserved
	check("explicit conn budget", c, [3]int64{20000000, wantTenant, wantTenant + int64(d.ConnsMax)*server.ResponseBytesReserved})
	// An explicit node budget: the levels below follow it, not the plan.
	c = withLog(16<<20, small+"\n[limits]\nresponse_bytes_per_node_max = 200000000\n")
	check("explicit node budget", c, [3]int64{server.ResponseBytesPerConnMaxDefault, server.ResponseBytesPerTenantMaxDefault, 200000000})
}

// TestBudgetsAboveMemory: budgets the [limits] table sets above what the
// memory plan gives them are named (kvnode logs them at start), those at
// or below it are not, and the default config names none.
func TestBudgetsAboveMemory(t *testing.T) {
	parse := func(extra string) *Config {
		t.Helper()
		c, err := parseConfig([]byte(strings.Replace(readExample(t), "size_bytes = 268435456", "size_bytes = 16777216", 1) + extra))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if over := parse("").budgetsAboveMemory(); len(over) != 0 {
		t.Fatalf("the default config: %v", over)
	}
	small := "\n[memory]\nbudget_bytes = 201326592\n"
	derived := parse(small).clientServerConfig(nil)
	at := parse(small + fmt.Sprintf("\n[limits]\nresponse_bytes_per_node_max = %d\n", derived.ResponseBytesPerNodeMax))
	if over := at.budgetsAboveMemory(); len(over) != 0 {
		t.Fatalf("a node response budget at the derived %d: %v", derived.ResponseBytesPerNodeMax, over)
	}
	above := parse(small + fmt.Sprintf("\n[limits]\nresponse_bytes_per_node_max = %d\nrequest_bytes_per_conn_max = %d\n",
		derived.ResponseBytesPerNodeMax+1, derived.RequestBytesPerConnMax+1))
	over := above.budgetsAboveMemory()
	if len(over) != 2 || !strings.Contains(over[0], "limits.response_bytes_per_node_max") || !strings.Contains(over[1], "limits.request_bytes_per_conn_max") {
		t.Fatalf("one byte above the derived node response and connection request budgets: %v", over)
	}
}
