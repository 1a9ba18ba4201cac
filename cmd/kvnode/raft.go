package main

// The Raft comparison path (replication = "raft"), owned by the
// raft+kvbench helper. It reuses the config's peers, tenants, client and
// admin addresses and the [consensus] timeouts; [pmem] is validated but
// unused (the raft WAL is a file that is fdatasynced).

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"

	"synod/kv/server"
	"synod/raftpath"
	"synod/tenants"
)

// RaftConfig is the [raft] table, read only with replication = "raft".
type RaftConfig struct {
	// WALDir holds the raft WAL; "" is data_dir/raft. Put it on /dev/shm
	// for the durability ablation (survives a process crash, not a power
	// loss).
	WALDir string `toml:"wal_dir"`
	// SnapshotEntries: applied entries between snapshots (0: 10,000).
	SnapshotEntries uint64 `toml:"snapshot_entries"`
}

// validateReplication checks replication and, for raft, its table.
func (c *Config) validateReplication() error {
	switch c.Replication {
	case "", "paxos":
		return nil
	case "raft":
		for _, p := range c.Peers {
			if p.ID >= 1<<16 {
				return fmt.Errorf("peers: id %d: the raft path takes ids below 65536", p.ID)
			}
		}
		return nil
	}
	return fmt.Errorf("replication: %q is not one of paxos, raft", c.Replication)
}

// raftTiming converts the [consensus] clock to etcd's: raft ticks once
// per heartbeat (as etcd does), and the election timeout in wall time
// stays the same as the Paxos path's, so leader changes compare fairly.
func raftTiming(c *Config) (tick time.Duration, election, heartbeat int) {
	hb := c.Consensus.HeartbeatTicks
	tick = c.TickDuration() * time.Duration(hb)
	election = max(2, c.Consensus.ElectionTicks/hb)
	return tick, election, 1
}

// runRaftNode runs one raftpath replica until SIGTERM/SIGINT or a fatal
// storage error.
func runRaftNode(cfg *Config) error {
	log := newLogger(cfg).With().Str("replication", "raft").Logger()
	reg, err := tenants.NewRegistry(cfg.tenantSpecs())
	if err != nil {
		return err
	}
	walDir := cfg.Raft.WALDir
	if walDir == "" {
		walDir = filepath.Join(cfg.DataDir, "raft")
	}
	tick, election, heartbeat := raftTiming(cfg)
	rcfg := raftpath.Config{ID: cfg.NodeID, DataDir: cfg.DataDir, WALDir: walDir, Tick: tick,
		ElectionTicks: election, HeartbeatTicks: heartbeat, SnapshotEntries: cfg.Raft.SnapshotEntries, Log: log,
		SM: cfg.smOptions()}
	for _, p := range cfg.Peers {
		rcfg.Peers = append(rcfg.Peers, raftpath.Peer{ID: p.ID, Addr: p.ConsensusAddr, ClientAddr: p.ClientAddr})
	}
	if err := cfg.prepareDataDir(log); err != nil {
		return err
	}
	// The raft streams listen on consensus_listen (TCP).
	rln, err := net.Listen("tcp", cfg.ConsensusListen)
	if err != nil {
		return fmt.Errorf("listening for raft peers on %s: %w", cfg.ConsensusListen, err)
	}
	rcfg.Listener = rln
	node, err := raftpath.Open(rcfg)
	if err != nil {
		rln.Close()
		return err
	}
	durability := "fsync-file: fdatasync of a WAL file in " + walDir
	// Tenant handling as the design's front end has it: the software
	// token-bucket shaper admits frames from the fixed header.
	tmetrics := tenants.NewMetrics(reg)
	shaper := tenants.NewShaper(reg, time.Now, tmetrics)
	rbackend := raftpath.NewBackend(node)
	rbackend.Tenants = tmetrics // the same per-tenant series as the Paxos path
	backend := cfg.spaceGuard(rbackend, reg, node.SM(), node.IsLeader, nil)
	backend.Start(log.With().Str("loop", "space").Logger())
	defer backend.Stop()
	scfg := cfg.clientServerConfig(shaperAdmitter{shaper})
	scfg.AdminToken = cfg.Admin.token // member ops are refused by the raft backend, with the reason
	// The open-file limit against what the caps add up to (fd_budget.go).
	warnFDLimit(fdNeed(scfg), nofileLimit(), scfg, log)
	srv := server.New(scfg, reg, backend, log.With().Str("loop", "server").Logger())
	ln, err := net.Listen("tcp", cfg.ClientListen)
	if err == nil {
		ln, err = cfg.TLS.listener(ln) // TLS when [tls] sets a certificate
	}
	if err != nil {
		node.Close()
		return fmt.Errorf("listening for clients on %s: %w", cfg.ClientListen, err)
	}
	serveClients(srv, ln, log)
	rs, err := cfg.serveRESP(srv, reg, backend, log) // resp_listen: under srv's limits
	if err != nil {
		srv.Close()
		node.Close()
		return err
	}
	promReg := raftPromRegistry(node)
	promReg.MustRegister(tmetrics)
	promReg.MustRegister(srv.Collector()) // connection caps, response budgets ([limits])
	if rs != nil {
		promReg.MustRegister(rs.Collector())
	}
	admin, err := listenAdmin(cfg.AdminListen, cfg.adminHandler(raftAdminMux(node, promReg, durability), log))
	if err != nil {
		srv.Close()
		closeRESP(rs)
		node.Close()
		return fmt.Errorf("listening for admin on %s: %w", cfg.AdminListen, err)
	}
	log.Info().Str("client", cfg.ClientListen).Str("client_tls", cfg.TLS.mode()).Str("raft", cfg.ConsensusListen).Str("admin", cfg.AdminListen).
		Dur("tick", tick).Int("election_ticks", election).Str("durability", durability).Msg("kvnode serving (raft)")

	runErr := awaitStop(log, node.Fatal(), "fatal raft error; shutting down")
	if err := shutdown(log, srv, admin, func() {
		closeRESP(rs)
		if err := node.Close(); err != nil {
			log.Warn().Err(err).Msg("closing the raft node")
		}
	}); err != nil {
		return err
	}
	return runErr
}

// raftAdminMux serves /metrics and /status (the same JSON
// shape as the Paxos path; promised is [term, leader]).
func raftAdminMux(node *raftpath.Node, reg *prometheus.Registry, durability string) *http.ServeMux {
	mux := debugMux(reg)
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		s := node.Status()
		role := "follower"
		switch s.Role {
		case raft.StateLeader:
			role = "leader"
		case raft.StateCandidate, raft.StatePreCandidate:
			role = "candidate"
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(nodeStatus{ID: s.ID, Role: role, Leader: s.Leader, Promised: [2]uint64{s.Term, s.Leader},
			Commit: s.Commit, Applied: s.Applied, LastSlot: s.Commit, LeaseValid: false, Durability: durability})
	})
	return mux
}
