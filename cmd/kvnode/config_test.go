package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExampleConfigsParse(t *testing.T) {
	files, _ := filepath.Glob("../../examples/local-cluster/*.toml")
	files = append(files, "../../examples/kvnode.toml")
	if len(files) != 4 {
		t.Fatalf("want 4 example configs, found %v", files)
	}
	for _, f := range files {
		c, err := loadConfig(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if len(c.Peers) != 3 || c.PMem.Mode != "shm" || c.TickDuration().Milliseconds() != 1 {
			t.Fatalf("%s: unexpected %+v", f, c)
		}
	}
}

func TestDevConfigParses(t *testing.T) {
	for i := 1; i <= devNodes; i++ {
		c, err := parseConfig([]byte(devConfig(devPortDefault, i, "/tmp/x", "/dev/shm/x.pmem", "shm", strings.Repeat("ab", 32))))
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		if c.NodeID != uint64(i) || len(c.Tenants) != 1 || c.Tenants[0].Token != devToken {
			t.Fatalf("node %d: %+v", i, c)
		}
	}
}

func readExample(t *testing.T) string {
	b, err := os.ReadFile("../../examples/kvnode.toml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestUnknownKeyIsNamed(t *testing.T) {
	base := readExample(t)
	for _, tc := range []struct{ edit, key string }{
		{strings.Replace(base, "log_level = \"info\"", "log_level = \"info\"\nlog_levle = \"debug\"", 1), "log_levle"},
		{strings.Replace(base, "mode = \"shm\"", "mode = \"shm\"\nsize_mb = 4", 1), "pmem.size_mb"},
		{strings.Replace(base, "apply = -1", "apply = -1\ngc = 1", 1), "cores.gc"},
		{strings.Replace(base, "client_addr = \"127.0.0.1:7003\"", "client_addr = \"127.0.0.1:7003\"\nweight = 2", 1), "peers.weight"},
	} {
		_, err := parseConfig([]byte(tc.edit))
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Fatalf("unknown key %s: got %v", tc.key, err)
		}
	}
}

func TestInvalidConfigs(t *testing.T) {
	base := readExample(t)
	for _, tc := range []struct{ old, new, want string }{
		{"rx = -1", "rx = 4096", "cores.rx"},
		{"consensus = -1", "consensus = -7", "cores.consensus"},
		{"mode = \"shm\"", "mode = \"nvram\"", "pmem.mode"},
		{"kind = \"udp\"", "kind = \"carrier-pigeon\"", "transport.kind"},
		{"kind = \"udp\"", "kind = \"afxdp\"", "interface"},
		{"kind = \"udp\"", "kind = \"auto\"\ninterface = \"lo\"\npoll = \"sometimes\"", "poll"},
		{"kind = \"udp\"", "kind = \"auto\"\npoll = \"sometimes\"", "poll"},
		{"tick = \"1ms\"", "tick = \"soon\"", "consensus.tick"},
		{"snapshot_transfer = \"whole\"", "snapshot_transfer = \"some\"", "consensus.snapshot_transfer"},
		{"catch_up_log_percent = 40", "catch_up_log_percent = 41", "consensus.catch_up_log_percent: 41 outside 0..40"},
		{"catch_up_log_percent = 40", "catch_up_log_percent = -1", "consensus.catch_up_log_percent"},
		{"node_id = 1", "node_id = 9", "node_id 9 is not listed"},
		{"heartbeat_ticks = 20", "heartbeat_ticks = 500", "heartbeat_ticks"},
		// Written as 0, a tick count is refused (fillDefaults would read it
		// as absent); each key at its boundary: 0 refused, 1 taken below.
		{"drift_ticks = 10", "drift_ticks = 0", "consensus.drift_ticks: 0 must be at least 1 (absent takes the default 10)"},
		{"drift_ticks = 10", "drift_ticks = -1", "consensus.drift_ticks: -1 must be at least 1"},
		{"lease_ticks = 100", "lease_ticks = 0", "consensus.lease_ticks: 0 must be at least 1"},
		{"heartbeat_ticks = 20", "heartbeat_ticks = 0", "consensus.heartbeat_ticks: 0 must be at least 1"},
		{"election_ticks = 150", "election_ticks = 0", "consensus.election_ticks: 0 must be at least 1"},
		{"drift_ticks = 10", "drift_ticks = 100", "drift_ticks (100) < lease_ticks (100)"},
		{"consensus_addr = \"127.0.0.1:7012\"", "consensus_addr = \"nowhere\"", "peers[1].consensus_addr"},
		{"log_level = \"info\"", "log_level = \"loud\"", "log_level"},
		{"accel = \"off\"", "accel = \"hard\"", "accel"},
		{"accel = \"off\"", "accel_trace = \"/tmp/x\"", "accel_trace"},
		{"node_id = 1", "node_id = \"one\"", "line"},
		{"cluster_secret = \"5e0c", "cluster_secret = \"zz0c", "security.cluster_secret: not hex"},
		{"cluster_secret = \"5e0c3a7b9d1f2e4a6c8b0d2f4e6a8c0b1d3f5e7a9c1b3d5f7e9a1c3b5d7f9e1a\"", "cluster_secret = \"5e0c3a\"", "want at least 16"},
		{"cluster_secret = \"5e0c3a7b9d1f2e4a6c8b0d2f4e6a8c0b1d3f5e7a9c1b3d5f7e9a1c3b5d7f9e1a\"", "", "security.cluster_secret: a Paxos cluster"},
		{"# accepted_secrets = []", "accepted_secrets = [\"00\"]", "security.accepted_secrets[0]"},
		{"# accepted_secrets = []", "cluster_secret_file = \"/nonexistent\"", "not both"},
	} {
		if !strings.Contains(base, tc.old) {
			t.Fatalf("example lacks %q", tc.old)
		}
		_, err := parseConfig([]byte(strings.Replace(base, tc.old, tc.new, 1)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s -> %s: want error naming %q, got %v", tc.old, tc.new, tc.want, err)
		}
	}
}

// TestTicksAtOne: each tick count written as 1 (the least) is taken as
// written, not replaced by its default.
func TestTicksAtOne(t *testing.T) {
	base := readExample(t)
	for _, tc := range []struct {
		old, new string
		got      func(*Config) int
	}{
		{"drift_ticks = 10", "drift_ticks = 1", func(c *Config) int { return c.Consensus.DriftTicks }},
		{"heartbeat_ticks = 20", "heartbeat_ticks = 1", func(c *Config) int { return c.Consensus.HeartbeatTicks }},
	} {
		c, err := parseConfig([]byte(strings.Replace(base, tc.old, tc.new, 1)))
		if err != nil {
			t.Fatalf("%s: %v", tc.new, err)
		}
		if got := tc.got(c); got != 1 {
			t.Errorf("%s: taken as %d", tc.new, got)
		}
	}
}

// TestLeaseOrderIsPaxos: drift_ticks must be below lease_ticks on the
// paxos path (leases are paxos's), and the raft path, which reads neither,
// takes a config that orders them otherwise, as it did before the check.
func TestLeaseOrderIsPaxos(t *testing.T) {
	base := strings.Replace(readExample(t), "lease_ticks = 100", "lease_ticks = 5", 1)
	if _, err := parseConfig([]byte(base)); err == nil || !strings.Contains(err.Error(), "drift_ticks (10) < lease_ticks (5)") {
		t.Fatalf("paxos with drift 10 and lease 5: %v", err)
	}
	raft := strings.Replace(base, `# replication = "raft"`, `replication = "raft"`, 1)
	if _, err := parseConfig([]byte(raft)); err != nil {
		t.Fatalf("raft with drift 10 and lease 5: %v", err)
	}
}

// TestCatchUpLogPercent: consensus.catch_up_log_percent absent is the
// default (the most the replica allows), 0 stays 0 (only the tail of
// slots), and a value in range is kept.
func TestCatchUpLogPercent(t *testing.T) {
	base := readExample(t)
	for _, tc := range []struct {
		line string
		want int
	}{{"", catchUpLogPercentDefault}, {"catch_up_log_percent = 0", 0}, {"catch_up_log_percent = 25", 25}} {
		c, err := parseConfig([]byte(strings.Replace(base, "catch_up_log_percent = 40", tc.line, 1)))
		if err != nil {
			t.Fatalf("%q: %v", tc.line, err)
		}
		if got := catchUpLogPercent(c.Consensus.CatchUpLogPercent); got != tc.want {
			t.Fatalf("%q: share %d, want %d", tc.line, got, tc.want)
		}
	}
	if catchUpLogPercentDefault != 40 {
		t.Fatalf("default %d: the README and the example say 40", catchUpLogPercentDefault)
	}
}
