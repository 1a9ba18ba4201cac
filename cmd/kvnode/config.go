package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
	"github.com/rs/zerolog"

	"synod/afxdp"
	"synod/kv/replica"
	"synod/pmem"
)

// Config is kvnode's configuration file (TOML). Every key is checked: an
// unknown key is an error that names it. examples/kvnode.toml documents
// each field.
type Config struct {
	NodeID    uint64 `toml:"node_id"`
	ClusterID uint64 `toml:"cluster_id"`
	DataDir   string `toml:"data_dir"`
	// ClientListen serves the binary client protocol (TCP).
	ClientListen string `toml:"client_listen"`
	// ConsensusListen receives consensus datagrams (UDP) and the side
	// channel (TCP, same port). It must equal this node's consensus_addr
	// in [[peers]] unless binding to a wildcard address.
	ConsensusListen string `toml:"consensus_listen"`
	// AdminListen serves /metrics, /debug/pprof and /status over HTTP.
	AdminListen string `toml:"admin_listen"`
	LogLevel    string `toml:"log_level"`
	// FaultInjection enables POST /debug/faults on the admin address (tests
	// and drills only: it lets anyone who reaches the admin port partition
	// this node).
	FaultInjection bool `toml:"fault_injection"`
	// Accel is "off" (default) or "soft": the accel plane's fast path (the
	// leader's quorum aggregator commits to the apply loop, a follower
	// persists and answers Accepts from the receive loop, the heartbeat
	// engine runs on its own goroutine) while software paxos still decides
	// and the two commit decisions are checked against each other.
	// AccelTrace, when set, records the plane's trace there.
	Accel      string `toml:"accel"`
	AccelTrace string `toml:"accel_trace"`
	// AccelShaper (accel = "soft" only) admits client frames with the
	// plane's per-tenant token buckets instead of tenants.Shaper.
	AccelShaper bool `toml:"accel_shaper"`

	Peers     []PeerConfig    `toml:"peers"`
	PMem      PMemConfig      `toml:"pmem"`
	Cores     CoresConfig     `toml:"cores"`
	Transport TransportConfig `toml:"transport"`
	Consensus ConsensusConfig `toml:"consensus"`
	Tenants   []TenantConfig  `toml:"tenants"`

	// Replication is "paxos" (default) or "raft" (the comparison path,
	// see raft.go and its [raft] table).
	Replication string     `toml:"replication"`
	Raft        RaftConfig `toml:"raft"`

	// Security authenticates consensus traffic ([security], config_security.go).
	Security SecurityConfig `toml:"security"`
	// Admin secures the admin endpoint ([admin], config_admin.go).
	Admin AdminConfig `toml:"admin"`
	// TLS serves the client port over TLS ([tls], config_tls.go).
	TLS TLSConfig `toml:"tls"`
	// Limits bounds client connections and responses ([limits], config_limits.go).
	Limits LimitsConfig `toml:"limits"`
	// RESPConfig: resp_listen, the Redis protocol endpoint (config_resp.go).
	RESPConfig
	// Stall is the stall detector ([stall], config_stall.go).
	Stall StallConfig `toml:"stall"`
	// Memory is the node's memory budget ([memory], config_memory.go).
	Memory MemoryConfig `toml:"memory"`

	// join is kvnode --join (main.go): a new node, not yet in the
	// committed membership, that waits to be added (kv/replica members.go).
	join bool
}

// PeerConfig is one member of the group.
type PeerConfig struct {
	ID            uint64 `toml:"id"`
	ConsensusAddr string `toml:"consensus_addr"`
	ClientAddr    string `toml:"client_addr"`
}

// PMemConfig places the acceptor log.
type PMemConfig struct {
	Path      string `toml:"path"`
	SizeBytes int64  `toml:"size_bytes"`
	Mode      string `toml:"mode"` // dax | msync | shm
}

// CoresConfig pins loops to CPUs; -1 (the default) leaves a loop unpinned.
type CoresConfig struct {
	RX        *int `toml:"rx"`
	TX        *int `toml:"tx"`
	Consensus *int `toml:"consensus"`
	Apply     *int `toml:"apply"`
}

// TransportConfig chooses the datagram transport. The AF_XDP fields are
// used only with kind "afxdp" or "auto"; the socket's address and port are
// consensus_listen's, and its poll loop is pinned to cores.rx.
type TransportConfig struct {
	Kind                  string `toml:"kind"` // udp | afxdp | auto
	Interface             string `toml:"interface"`
	Queue                 int    `toml:"queue"`
	Poll                  string `toml:"poll"` // busy | adaptive
	SpinMicros            int    `toml:"spin_micros"`
	FrameBytes            int    `toml:"frame_bytes"`
	FrameCount            int    `toml:"frame_count"`
	ZeroCopy              bool   `toml:"zero_copy"`
	Attach                string `toml:"attach"` // native | generic | auto
	AcceptPartialChecksum bool   `toml:"accept_partial_checksum"`
}

// afxdpConfig is the afxdp.Config of this node's transport.
func (c *Config) afxdpConfig() afxdp.Config {
	ap, _ := netip.ParseAddrPort(c.ConsensusListen)
	t := c.Transport
	ac := afxdp.Config{
		Interface: t.Interface, QueueID: t.Queue, Addr: ap.Addr(), Port: ap.Port(),
		Poll: t.Poll, SpinMicros: t.SpinMicros, FrameBytes: t.FrameBytes, FrameCount: t.FrameCount,
		ZeroCopy: t.ZeroCopy, Attach: t.Attach, AcceptPartialChecksum: t.AcceptPartialChecksum,
	}
	if rx := cpuOrUnpinned(c.Cores.RX); rx >= 0 {
		ac.Cores = []int{rx}
		if tx := cpuOrUnpinned(c.Cores.TX); tx >= 0 {
			ac.Cores = append(ac.Cores, tx)
		}
	}
	return ac
}

// Values of consensus.snapshot_transfer.
const (
	snapshotTransferDelta = "delta"
	snapshotTransferWhole = "whole"
)

// explicitTicksPositive refuses a [consensus] tick count written as 0 or
// less: fillDefaults reads 0 as "absent" and would put the default in its
// place without a word (an outside tester's drift_ticks = 0, which the
// docs say must be at least 1, ran with 10), so the written value is
// looked at here. b decoded once already (unknown keys refused).
func explicitTicksPositive(b []byte) error {
	var written struct {
		Consensus struct {
			ElectionTicks  *int `toml:"election_ticks"`
			HeartbeatTicks *int `toml:"heartbeat_ticks"`
			LeaseTicks     *int `toml:"lease_ticks"`
			DriftTicks     *int `toml:"drift_ticks"`
		} `toml:"consensus"`
	}
	if err := toml.Unmarshal(b, &written); err != nil {
		return err
	}
	w := written.Consensus
	for _, k := range []struct {
		key string
		v   *int
		def int
	}{
		{"election_ticks", w.ElectionTicks, defaultElectionTicks}, {"heartbeat_ticks", w.HeartbeatTicks, defaultHeartbeatTicks},
		{"lease_ticks", w.LeaseTicks, defaultLeaseTicks}, {"drift_ticks", w.DriftTicks, defaultDriftTicks},
	} {
		if k.v != nil && *k.v <= 0 {
			return fmt.Errorf("consensus.%s: %d must be at least 1 (absent takes the default %d)", k.key, *k.v, k.def)
		}
	}
	return nil
}

// ConsensusConfig sets the paxos clock. Durations are Go duration strings.
type ConsensusConfig struct {
	Tick           string `toml:"tick"`
	ElectionTicks  int    `toml:"election_ticks"`
	HeartbeatTicks int    `toml:"heartbeat_ticks"`
	LeaseTicks     int    `toml:"lease_ticks"`
	DriftTicks     int    `toml:"drift_ticks"`
	// SnapshotTransfer is how a node that holds state catches up by
	// snapshot: "whole" (default: the whole state) or "delta" (only the
	// key ranges that differ, after both ends hash their whole state:
	// kv/README.md "Delta snapshots"; fewer bytes, more reading).
	SnapshotTransfer string `toml:"snapshot_transfer"`
	// CatchUpLogPercent is the share of the acceptor log (pmem.size_bytes)
	// that compaction keeps below a snapshot for followers that fell
	// behind: one that missed fewer bytes of writes catches up from the
	// log, not by a snapshot (kv/replica log_tail.go). Absent:
	// catchUpLogPercentDefault; 0 keeps only a short tail of slots; at most
	// replica.CatchUpLogPercentMax.
	CatchUpLogPercent *int `toml:"catch_up_log_percent"`
}

// catchUpLogPercentDefault is consensus.catch_up_log_percent when absent:
// the most the replica allows, since the node's memory budget already
// holds a full log (config_memory.go).
const catchUpLogPercentDefault = replica.CatchUpLogPercentMax

// TenantConfig is one tenant. Rates and limits are enforced by the tenant
// shaper; zero means unlimited.
type TenantConfig struct {
	ID            uint32  `toml:"id"`
	Name          string  `toml:"name"`
	Token         string  `toml:"token"`
	OpsPerSec     float64 `toml:"ops_per_sec"`
	OpsBurst      float64 `toml:"ops_burst"`
	BytesPerSec   float64 `toml:"bytes_per_sec"`
	BytesBurst    float64 `toml:"bytes_burst"`
	Priority      string  `toml:"priority"` // critical | standard | bulk
	MaxKeyBytes   int     `toml:"max_key_bytes"`
	MaxValueBytes int     `toml:"max_value_bytes"`
	QuotaBytes    int64   `toml:"quota_bytes"`
	// ClientsMax is the tenant's share of the exactly-once client table
	// (0: the default share; see kv/sm).
	ClientsMax int `toml:"clients_max"`
}

// Defaults and limits of the configuration.
const (
	configBytesMax        = 1 << 20
	defaultTick           = time.Millisecond
	defaultElectionTicks  = 150
	defaultHeartbeatTicks = 20
	defaultLeaseTicks     = 100
	defaultDriftTicks     = 10
	defaultPMemSizeBytes  = 256 << 20
	// pmemSizeBytesMin: every node's ring must take any record a leader
	// may send (replica.AcceptorLogBytesMin).
	pmemSizeBytesMin = pmem.RegionHeaderBytes + replica.AcceptorLogBytesMin
	tickMin          = 100 * time.Microsecond
	tickMax          = time.Second
)

// loadConfig reads and validates a config file.
func loadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return parseConfig(b)
}

// parseConfig decodes strictly, fills defaults and validates.
func parseConfig(b []byte) (*Config, error) {
	if len(b) > configBytesMax {
		return nil, fmt.Errorf("config: %d bytes exceeds %d", len(b), configBytesMax)
	}
	var c Config
	dec := toml.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		var sm *toml.StrictMissingError
		if errors.As(err, &sm) {
			var keys []string
			for _, e := range sm.Errors {
				keys = append(keys, strings.Join(e.Key(), "."))
			}
			return nil, fmt.Errorf("config: unknown key(s) %s", strings.Join(keys, ", "))
		}
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return nil, fmt.Errorf("config: line %d column %d: %s", row, col, de.Error())
		}
		return nil, fmt.Errorf("config: %w", err)
	}
	if err := explicitTicksPositive(b); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c.fillDefaults()
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	for _, v := range []func() error{c.Security.validate, c.validateAdmin, c.TLS.validate, c.Limits.validate, c.validateRESP, c.validateStall, c.validateMemory, c.validateDerivedLimits, c.validateDiskReserve} {
		if err := v(); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	if c.Replication != "raft" && len(c.Peers) > 1 && !c.Security.set() {
		return nil, errors.New("config: security.cluster_secret: a Paxos cluster of more than one node needs a cluster secret " +
			"(every member the same; e.g. `openssl rand -hex 32`): it authenticates every consensus packet")
	}
	return &c, nil
}

func (c *Config) fillDefaults() {
	if c.Accel == "" {
		c.Accel = "off"
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.Transport.Kind == "" {
		c.Transport.Kind = "udp"
	}
	if c.PMem.SizeBytes == 0 {
		c.PMem.SizeBytes = defaultPMemSizeBytes
	}
	if c.Consensus.Tick == "" {
		c.Consensus.Tick = defaultTick.String()
	}
	if c.Consensus.ElectionTicks == 0 {
		c.Consensus.ElectionTicks = defaultElectionTicks
	}
	if c.Consensus.HeartbeatTicks == 0 {
		c.Consensus.HeartbeatTicks = defaultHeartbeatTicks
	}
	if c.Consensus.LeaseTicks == 0 {
		c.Consensus.LeaseTicks = defaultLeaseTicks
	}
	if c.Consensus.DriftTicks == 0 {
		c.Consensus.DriftTicks = defaultDriftTicks
	}
	if c.Consensus.SnapshotTransfer == "" {
		c.Consensus.SnapshotTransfer = snapshotTransferWhole
	}
	if c.Consensus.CatchUpLogPercent == nil {
		pct := catchUpLogPercentDefault
		c.Consensus.CatchUpLogPercent = &pct
	}
	if c.ConsensusListen == "" {
		for _, p := range c.Peers {
			if p.ID == c.NodeID {
				c.ConsensusListen = p.ConsensusAddr
			}
		}
	}
	if c.ClientListen == "" {
		for _, p := range c.Peers {
			if p.ID == c.NodeID {
				c.ClientListen = p.ClientAddr
			}
		}
	}
}

// TickDuration is the parsed tick period (valid after parseConfig).
func (c *Config) TickDuration() time.Duration {
	d, _ := time.ParseDuration(c.Consensus.Tick)
	return d
}

func (c *Config) validate() error {
	if c.NodeID == 0 {
		return errors.New("node_id: must be set and non-zero")
	}
	if c.DataDir == "" {
		return errors.New("data_dir: must be set")
	}
	if _, err := zerolog.ParseLevel(c.LogLevel); err != nil {
		return fmt.Errorf("log_level: %q is not one of trace, debug, info, warn, error", c.LogLevel)
	}
	if len(c.Peers) == 0 {
		return errors.New("peers: at least one [[peers]] entry (this node) is required")
	}
	self := false
	ids := map[uint64]bool{}
	for i, p := range c.Peers {
		if p.ID == 0 {
			return fmt.Errorf("peers[%d].id: must be non-zero", i)
		}
		if ids[p.ID] {
			return fmt.Errorf("peers[%d].id: duplicate id %d", i, p.ID)
		}
		ids[p.ID] = true
		if _, err := netip.ParseAddrPort(p.ConsensusAddr); err != nil {
			return fmt.Errorf("peers[%d].consensus_addr: %q is not ip:port: %v", i, p.ConsensusAddr, err)
		}
		if _, _, err := net.SplitHostPort(p.ClientAddr); err != nil {
			return fmt.Errorf("peers[%d].client_addr: %q is not host:port: %v", i, p.ClientAddr, err)
		}
		self = self || p.ID == c.NodeID
	}
	if !self {
		return fmt.Errorf("peers: node_id %d is not listed", c.NodeID)
	}
	if _, err := netip.ParseAddrPort(c.ConsensusListen); err != nil {
		return fmt.Errorf("consensus_listen: %q is not ip:port: %v", c.ConsensusListen, err)
	}
	if _, _, err := net.SplitHostPort(c.ClientListen); err != nil {
		return fmt.Errorf("client_listen: %q is not host:port: %v", c.ClientListen, err)
	}
	if c.AdminListen != "" {
		if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
			return fmt.Errorf("admin_listen: %q is not host:port: %v", c.AdminListen, err)
		}
	}
	switch c.Accel {
	case "off", "soft":
	default:
		return fmt.Errorf("accel: %q is not one of off, soft", c.Accel)
	}
	if c.AccelTrace != "" && c.Accel == "off" {
		return errors.New("accel_trace: needs accel = \"soft\"")
	}
	if c.AccelShaper && c.Accel != "soft" {
		return errors.New("accel_shaper: needs accel = \"soft\"")
	}
	switch c.PMem.Mode {
	case "dax", "msync", "shm":
	default:
		return fmt.Errorf("pmem.mode: %q is not one of dax, msync, shm", c.PMem.Mode)
	}
	if c.PMem.Path == "" {
		return errors.New("pmem.path: must be set")
	}
	if c.PMem.SizeBytes < pmemSizeBytesMin {
		return fmt.Errorf("pmem.size_bytes: %d is below the minimum %d", c.PMem.SizeBytes, pmemSizeBytesMin)
	}
	if c.PMem.SizeBytes%pmem.RegionAlignBytes != 0 {
		// Caught here, naming the key, not when the log is opened.
		return fmt.Errorf("pmem.size_bytes: %d is not a multiple of %d", c.PMem.SizeBytes, pmem.RegionAlignBytes)
	}
	switch c.Transport.Kind {
	case afxdp.TransportUDP:
	case afxdp.TransportAFXDP, afxdp.TransportAuto:
		ac := c.afxdpConfig()
		if c.Transport.Kind == afxdp.TransportAuto && ac.Interface == "" {
			// auto finds the interface holding consensus_listen's address
			// when it opens (or falls back to UDP); check the rest now.
			ac.Interface = "lo"
		}
		if err := ac.Validate(); err != nil {
			return fmt.Errorf("transport: %w", err)
		}
	default:
		return fmt.Errorf("transport.kind: %q is not one of udp, afxdp, auto", c.Transport.Kind)
	}
	d, err := time.ParseDuration(c.Consensus.Tick)
	if err != nil || d < tickMin || d > tickMax {
		return fmt.Errorf("consensus.tick: %q must be a duration in [%v, %v]", c.Consensus.Tick, tickMin, tickMax)
	}
	cc := c.Consensus
	if cc.HeartbeatTicks <= 0 || cc.ElectionTicks <= cc.HeartbeatTicks {
		return fmt.Errorf("consensus: need 0 < heartbeat_ticks (%d) < election_ticks (%d)", cc.HeartbeatTicks, cc.ElectionTicks)
	}
	// Leases are paxos's: the raft path does not read lease_ticks or
	// drift_ticks, so their order is not checked there.
	if cc.LeaseTicks < 1 || cc.DriftTicks < 1 || cc.LeaseTicks >= cc.ElectionTicks || (cc.DriftTicks >= cc.LeaseTicks && c.Replication != "raft") {
		return fmt.Errorf("consensus: need 1 <= drift_ticks (%d) < lease_ticks (%d) < election_ticks (%d)", cc.DriftTicks, cc.LeaseTicks, cc.ElectionTicks)
	}
	if cc.SnapshotTransfer != snapshotTransferDelta && cc.SnapshotTransfer != snapshotTransferWhole {
		return fmt.Errorf("consensus.snapshot_transfer: %q is not one of %s, %s", cc.SnapshotTransfer, snapshotTransferDelta, snapshotTransferWhole)
	}
	if p := cc.CatchUpLogPercent; p != nil && (*p < 0 || *p > replica.CatchUpLogPercentMax) {
		return fmt.Errorf("consensus.catch_up_log_percent: %d outside 0..%d", *p, replica.CatchUpLogPercentMax)
	}
	if len(c.Tenants) == 0 {
		return errors.New("tenants: at least one [[tenants]] entry is required")
	}
	for i, t := range c.Tenants {
		switch t.Priority {
		case "", "critical", "standard", "bulk":
		default:
			return fmt.Errorf("tenants[%d].priority: %q is not one of critical, standard, bulk", i, t.Priority)
		}
		for _, n := range []struct {
			key string
			v   float64
		}{{"quota_bytes", float64(t.QuotaBytes)}, {"max_key_bytes", float64(t.MaxKeyBytes)}, {"max_value_bytes", float64(t.MaxValueBytes)},
			{"ops_per_sec", t.OpsPerSec}, {"ops_burst", t.OpsBurst}, {"bytes_per_sec", t.BytesPerSec}, {"bytes_burst", t.BytesBurst}} {
			if n.v < 0 {
				return fmt.Errorf("tenants[%d].%s: %v is negative (0 or absent: no limit)", i, n.key, n.v)
			}
		}
	}
	if _, err := c.clientShares(); err != nil {
		return err
	}
	if err := c.validateReplication(); err != nil {
		return err
	}
	return c.validateCores(runtime.NumCPU())
}

// validateCores checks every pinned CPU against the CPUs this process may
// run on.
func (c *Config) validateCores(ncpu int) error {
	for _, x := range []struct {
		name string
		cpu  *int
	}{{"rx", c.Cores.RX}, {"tx", c.Cores.TX}, {"consensus", c.Cores.Consensus}, {"apply", c.Cores.Apply}} {
		if x.cpu == nil || *x.cpu == -1 {
			continue
		}
		if *x.cpu < 0 || *x.cpu >= ncpu || !cpuAllowed(*x.cpu) {
			return fmt.Errorf("cores.%s: cpu %d does not exist or is not allowed for this process (allowed: %s)", x.name, *x.cpu, allowedCPUs(ncpu))
		}
	}
	return nil
}

func cpuOrUnpinned(p *int) int {
	if p == nil {
		return -1
	}
	return *p
}
