package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"synod/afxdp"
	"synod/kv/replica"
	"synod/kv/server"
	"synod/kv/sm"
	"synod/kv/space"
	"synod/paxos"
	"synod/pmem"
	"synod/tenants"
)

// runNode runs one replica until SIGTERM/SIGINT or a fatal error.
func runNode(cfg *Config) error {
	// The Go runtime's share of [memory] (config_memory.go), on either path.
	cfg.applyMemory(newLogger(cfg))
	applyGCPercent(newLogger(cfg)) // gc.go: relies on the memory limit just set
	if cfg.Replication == "raft" {
		if cfg.join {
			return errors.New(`--join is not supported with replication = "raft": its membership is the configured peers`)
		}
		return runRaftNode(cfg)
	}
	log := newLogger(cfg)

	reg, err := tenants.NewRegistry(cfg.tenantSpecs())
	if err != nil {
		return err
	}
	// The stall detector ([stall]): slow stages are counted, logged and
	// traced (internal/stall). Closed last, after the replica.
	stalls, err := cfg.stallDetector(log)
	if err != nil {
		return err
	}
	if stalls != nil {
		defer stalls.Close()
	}
	if err := cfg.prepareDataDir(log); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(cfg.PMem.Path), 0o750); err != nil {
		return fmt.Errorf("creating the pmem directory: %w", err)
	}
	popts := pmem.Options{
		Path: cfg.PMem.Path, SizeBytes: cfg.PMem.SizeBytes, Mode: pmem.Mode(cfg.PMem.Mode),
		ClusterID: cfg.ClusterID, NodeID: cfg.NodeID,
	}
	plog, rec, err := replica.OpenPMemLog(popts)
	if errors.Is(err, pmem.ErrLocked) {
		// A restart the moment the previous process was killed: the
		// kernel has not closed its files yet. Wait a bounded time; a
		// second live kvnode on the same log is refused all the same.
		log.Warn().Str("path", cfg.PMem.Path).Dur("wait_max", pmemLockWaitMax).
			Msg("the acceptor log is locked by another process (the previous kvnode still exiting?); waiting for it to let go")
		popts.LockWait = pmemLockWaitMax
		plog, rec, err = replica.OpenPMemLog(popts)
	}
	if err != nil {
		return fmt.Errorf("opening the pmem log %s: %w", cfg.PMem.Path, err)
	}
	mode := plog.Log().Mode()
	log.Info().Str("path", cfg.PMem.Path).Str("durability", string(mode)).Str("survives", mode.Survives()).
		Int("records", rec.Records).Str("cut", rec.CutReason).Uint64("generation", rec.Generation).
		Msgf("acceptor log open: durability mode %s (%s)", mode, mode.Survives())

	store, err := sm.Open(filepath.Join(cfg.DataDir, "sm"), cfg.smOptions())
	if err != nil {
		plog.Close()
		return fmt.Errorf("opening the state machine: %w", err)
	}
	conn, fallback, err := afxdp.OpenTransport(cfg.Transport.Kind, cfg.afxdpConfig())
	if err != nil {
		plog.Close()
		store.Close()
		return fmt.Errorf("opening the %s transport on %s: %w", cfg.Transport.Kind, cfg.ConsensusListen, err)
	}
	transport := cfg.Transport.Kind
	rxCPU := cpuOrUnpinned(cfg.Cores.RX)
	switch conn.(type) {
	case *afxdp.XDPConn:
		transport = afxdp.TransportAFXDP
		rxCPU = -1 // the AF_XDP conn pins the goroutine that reads it (cores.rx)
	default:
		transport = afxdp.TransportUDP
	}
	if fallback != nil {
		log.Warn().Err(fallback).Msg("transport auto: AF_XDP unavailable, using kernel UDP")
	}
	if rb, ok := conn.(interface{ ReceiveBufferBytes() (int, error) }); ok {
		// Linux caps the request at net.core.rmem_max silently; a small
		// grant is where bursts lose datagrams (kernel_buffer drops).
		if n, err := rb.ReceiveBufferBytes(); err == nil {
			ev := log.Info()
			if n < afxdp.ConsensusSocketBufferBytes {
				ev = log.Warn().Str("raise", "sysctl net.core.rmem_max")
			}
			ev.Int("asked_bytes", afxdp.ConsensusSocketBufferBytes).Int("granted_bytes", n).Msg("consensus socket receive buffer")
		}
	}

	promReg := newPromRegistry()
	promReg.MustRegister(newPebbleCollector(store))
	if tc := newTransportCollector(conn); tc != nil {
		promReg.MustRegister(tc)
	}
	if stalls != nil {
		promReg.MustRegister(stalls.Collector())
	}
	faults := &replica.Faults{}
	tmetrics := tenants.NewMetrics(reg)
	promReg.MustRegister(tmetrics)
	rcfg := replica.Config{
		ID:                paxos.NodeID(cfg.NodeID),
		ClusterID:         cfg.ClusterID,
		Tick:              cfg.TickDuration(),
		ElectionTicks:     cfg.Consensus.ElectionTicks,
		HeartbeatTicks:    cfg.Consensus.HeartbeatTicks,
		LeaseTicks:        cfg.Consensus.LeaseTicks,
		DriftTicks:        cfg.Consensus.DriftTicks,
		DeltaSnapshots:    cfg.Consensus.SnapshotTransfer == snapshotTransferDelta,
		CatchUpLogPercent: catchUpLogPercent(cfg.Consensus.CatchUpLogPercent),
		Cores: replica.Cores{
			RX: rxCPU, TX: cpuOrUnpinned(cfg.Cores.TX),
			Consensus: cpuOrUnpinned(cfg.Cores.Consensus), Apply: cpuOrUnpinned(cfg.Cores.Apply),
		},
		Log:     log,
		Metrics: replica.NewMetrics(promReg),
		Faults:  faults,
		// Writes reach the proposer through a deficit-round-robin
		// scheduler across tenants.
		Tenants:       reg,
		TenantMetrics: tmetrics,
		Stalls:        stalls,
		Join:          cfg.join, // --join (kv/replica members.go)
	}
	var traceFile *os.File
	if cfg.Accel == "soft" {
		rcfg.Accel = &replica.AccelConfig{}
		if cfg.AccelTrace != "" {
			if traceFile, err = os.Create(cfg.AccelTrace); err != nil {
				conn.Close()
				plog.Close()
				store.Close()
				return fmt.Errorf("creating accel_trace: %w", err)
			}
			defer traceFile.Close()
			rcfg.Accel.Trace = traceFile
		}
	}
	var memberIDs []paxos.NodeID
	for _, p := range cfg.Peers {
		ap, _ := netip.ParseAddrPort(p.ConsensusAddr)
		rcfg.Peers = append(rcfg.Peers, replica.Peer{ID: paxos.NodeID(p.ID), ConsensusAddr: ap, ClientAddr: p.ClientAddr})
		memberIDs = append(memberIDs, paxos.NodeID(p.ID))
	}
	if secrets, _ := cfg.Security.secrets(); secrets != nil {
		// Every consensus packet is sealed and checked (kv/replica/auth.go).
		// The incarnation never goes back across restarts, whatever the
		// clock does (incarnation.go).
		inc, behind, ierr := nextIncarnation(cfg.DataDir, time.Now())
		if ierr != nil {
			conn.Close()
			plog.Close()
			store.Close()
			return fmt.Errorf("security: %w", ierr)
		}
		if behind {
			log.Warn().Uint64("incarnation", inc).Msg("the clock is behind this node's last start: its consensus incarnation continues from the recorded one")
		}
		if rcfg.Auth, err = replica.NewAuth(cfg.ClusterID, paxos.NodeID(cfg.NodeID), memberIDs, secrets, time.Unix(0, int64(inc))); err != nil {
			conn.Close()
			plog.Close()
			store.Close()
			return fmt.Errorf("security: %w", err)
		}
		// Packets accepted before this start stay refused after it
		// (kv/replica auth_floors.go).
		floors, floorsGen, ferr := loadAuthFloors(cfg.DataDir)
		if ferr != nil {
			conn.Close()
			plog.Close()
			store.Close()
			return fmt.Errorf("security: %w", ferr)
		}
		rcfg.Auth.SetFloors(floors)
		keeper := startFloorsKeeper(cfg.DataDir, rcfg.Auth, floorsGen, log.With().Str("loop", "auth-floors").Logger())
		defer keeper.Stop()
	} else {
		log.Warn().Msg("no [security] cluster_secret: consensus traffic is not authenticated (a single-node cluster only)")
	}
	rep, err := replica.New(rcfg, conn, plog, store)
	if err != nil {
		conn.Close()
		plog.Close()
		store.Close()
		return err
	}
	rep.Start()

	// Per-tenant shaping happens on the fixed frame header, before the
	// body is decoded or anything reaches Pebble or Paxos.
	shaper := tenants.NewShaper(reg, time.Now, tmetrics)
	rbackend := replica.NewBackend(rep, store)
	rbackend.Tenants = tmetrics
	// Quotas and the disk reserve, before anything is proposed.
	// Every member's disk counts: the members report theirs to each other
	// (kv/replica disk_report.go) and the leader refuses growing writes
	// while any is below its reserve.
	backend := cfg.spaceGuard(rbackend, reg, store, func() bool { return rep.Status().Role == paxos.RoleLeader },
		func() []space.MemberDisk { return membersLowOnDisk(rep) })
	promReg.MustRegister(backend.Collector())
	backend.Start(log.With().Str("loop", "space").Logger())
	defer backend.Stop()
	if stalls != nil && cfg.Stall.cfg.Dir != "" {
		if room := stallTraceRoom(cfg.Stall.cfg.Dir, cfg.DataDir, backend.DiskSpace); room != nil {
			stalls.SetRoom(room)
		}
	}
	rep.ShareDiskSpace(func() replica.DiskSpace {
		free, reserve, low, failed := backend.DiskSpace()
		d := replica.DiskSpace{FreeBytes: free, ReserveBytes: reserve, Low: low, ReadFailed: failed}
		if reserve == 0 {
			// No reserve: the guard reads nothing, but a snapshot must not
			// begin to stage on a full disk (kv/replica snapshot_room.go).
			if _, f, err := space.FilesystemBytes(cfg.DataDir); err == nil {
				d.StagingFreeBytes, d.StagingFreeKnown = f, true
			}
		}
		return d
	})
	var admitter server.Admitter = shaperAdmitter{shaper}
	if cfg.AccelShaper {
		ad, err := rep.AccelAdmitter(reg, tmetrics)
		if err != nil {
			rep.Close()
			store.Close()
			return err
		}
		admitter = ad
	}
	// Shed by priority before the backlog starves consensus
	// (kv/replica/overload.go), then the tenant's own contract.
	admitter = replica.NewOverloadGuard(rep, reg, admitter)
	scfg := cfg.clientServerConfig(admitter)
	scfg.AdminToken = cfg.Admin.token // authorizes kvctl member (kv/server admin.go)
	// The open-file limit against what the caps add up to (fd_budget.go).
	warnFDLimit(fdNeed(scfg), nofileLimit(), scfg, log)
	srv := server.New(scfg, reg, backend, log.With().Str("loop", "server").Logger())
	promReg.MustRegister(srv.Collector()) // connection caps, response budgets ([limits])
	ln, err := net.Listen("tcp", cfg.ClientListen)
	if err == nil {
		ln, err = cfg.TLS.listener(ln) // TLS when [tls] sets a certificate
	}
	if err != nil {
		rep.Close()
		store.Close()
		return fmt.Errorf("listening for clients on %s: %w", cfg.ClientListen, err)
	}
	serveClients(srv, ln, log)
	rs, err := cfg.serveRESP(srv, reg, backend, log) // resp_listen: under srv's limits
	if err != nil {
		srv.Close()
		rep.Close()
		store.Close()
		return err
	}
	if rs != nil {
		promReg.MustRegister(rs.Collector()) // synod_resp_* (kv/resp/metrics.go)
	}

	mux := adminMux(rep, promReg, faults, cfg.FaultInjection)
	mux.Handle(snapshotPath, snapshotHandler(rep, store, cfg.ClusterID, log)) // backups (snapshot.go)
	mux.Handle(stallTracePath, stallTraceHandler(stalls, log))                // stall_trace_admin.go
	admin, err := listenAdmin(cfg.AdminListen, cfg.adminHandler(mux, log))
	if err != nil {
		srv.Close()
		closeRESP(rs)
		rep.Close()
		store.Close()
		return fmt.Errorf("listening for admin on %s: %w", cfg.AdminListen, err)
	}
	log.Info().Str("client", cfg.ClientListen).Str("client_tls", cfg.TLS.mode()).Str("resp", cfg.RESPListen).Str("consensus", cfg.ConsensusListen).Str("admin", cfg.AdminListen).
		Str("transport", transport).Str("accel", cfg.Accel).Str("tick", cfg.Consensus.Tick).Str("durability", string(mode)).
		Msg("kvnode serving")

	runErr := awaitStop(log, rep.Fatal(), "fatal replica error; shutting down")
	// Stop taking requests first; every write acknowledged so far is
	// already durable in a majority of acceptor logs. Then stop the
	// replica (it applies what was committed and queued) and close Pebble.
	if err := shutdown(log, srv, admin, func() {
		closeRESP(rs)
		if err := rep.Close(); err != nil {
			log.Warn().Err(err).Msg("closing the replica")
		}
		if err := store.Close(); err != nil {
			log.Warn().Err(err).Msg("closing the state machine")
		}
	}); err != nil {
		return err
	}
	return runErr
}

// tenantSpecs converts the [[tenants]] tables.
func (c *Config) tenantSpecs() []tenants.Spec {
	out := make([]tenants.Spec, 0, len(c.Tenants))
	for _, t := range c.Tenants {
		prio := tenants.ClassStandard
		switch t.Priority {
		case "critical":
			prio = tenants.ClassCritical
		case "bulk":
			prio = tenants.ClassBulk
		}
		out = append(out, tenants.Spec{
			ID: tenants.ID(t.ID), Name: t.Name, Token: t.Token,
			OpsPerSec: t.OpsPerSec, OpsBurst: t.OpsBurst, BytesPerSec: t.BytesPerSec, BytesBurst: t.BytesBurst,
			Priority: prio, MaxKeyBytes: t.MaxKeyBytes, MaxValueBytes: t.MaxValueBytes, QuotaBytes: t.QuotaBytes,
		})
	}
	return out
}

// nodeStatus is the JSON served at /status.
type nodeStatus struct {
	ID       uint64    `json:"id"`
	Role     string    `json:"role"`
	Leader   uint64    `json:"leader"`
	Promised [2]uint64 `json:"promised"`
	Commit   uint64    `json:"commit"`
	Applied  uint64    `json:"applied"`
	LastSlot uint64    `json:"last_slot"`
	// LeaseValid: a leader whose lease is still valid by the clock now
	// (replica.LeaseValidNow): false on a leader whose stalled loop has
	// not yet seen that it was deposed.
	LeaseValid bool `json:"lease_valid"`
	// LoopIdleMs is how long ago the consensus loop last began an
	// iteration: role, leader and commit are its view as of then.
	LoopIdleMs float64  `json:"loop_idle_ms"`
	Durability string   `json:"durability"`
	Blocked    []uint64 `json:"blocked,omitempty"`
	// Removed: this node knows itself outside the committed membership
	// (replica.Removed): stop it.
	Removed bool `json:"removed,omitempty"`
	// Stuck: this node has made no progress applying or truncating its
	// acceptor log with work waiting for 5 s (replica.Stuck); a stuck
	// leader hands leadership over.
	Stuck bool `json:"stuck"`
	// CommitWaitMs: on a leader, how long it has had entries above its
	// commit index without the index moving (replica.CommitWait): a
	// leader whose followers cannot take its writes (fetching snapshots,
	// logs full) is not stuck, but commits nothing.
	CommitWaitMs float64 `json:"commit_wait_ms"`
	// FirstSlot is the lowest slot still held in the paxos log (the
	// catch-up tail starts there; a follower behind it needs a snapshot).
	FirstSlot uint64 `json:"first_slot"`
	// ElectionsDeferred and PreCheckRefusals say why a follower that
	// hears no leader does not lead: elections it did not start because
	// what it would re-propose does not fit in its log, and pre-checks
	// the others refused (paxos.Status).
	ElectionsDeferred uint64 `json:"elections_deferred"`
	PreCheckRefusals  uint64 `json:"precheck_refusals"`
	// Accel: the plane-versus-software commit check (accel = "soft").
	Accel *accelStatus `json:"accel,omitempty"`
}

type accelStatus struct {
	Commits    int    `json:"commits"`
	Mismatches int    `json:"mismatches"`
	HandUps    uint64 `json:"handups"`
	First      string `json:"first_mismatch,omitempty"`
}

// adminMux serves /metrics, /status and, when enabled, /debug/faults
// (POST block=2,3 drops traffic to and from those peers; block= heals;
// delay_persist=1s delays the next acceptor-log persist once;
// delay_apply=30s stalls the apply loop once).
// adminHandler puts the token check in front of it.
func adminMux(rep *replica.Replica, reg *prometheus.Registry, faults *replica.Faults, faultInjection bool) *http.ServeMux {
	mux := debugMux(reg)
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		s := rep.Status()
		ns := nodeStatus{
			ID: uint64(s.ID), Role: s.Role.String(), Leader: uint64(s.Leader),
			Promised: [2]uint64{s.Promised.Round, uint64(s.Promised.Node)},
			Commit:   uint64(s.Commit), Applied: uint64(s.Applied), LastSlot: uint64(s.LastSlot),
			LeaseValid: rep.LeaseValidNow(&s), LoopIdleMs: float64(rep.LoopIdle().Microseconds()) / 1000,
			Durability: rep.Mode(), Removed: rep.Removed(), Stuck: rep.Stuck(),
			CommitWaitMs: float64(rep.CommitWait().Microseconds()) / 1000,
			FirstSlot:    uint64(s.FirstSlot), ElectionsDeferred: s.ElectionsDeferred, PreCheckRefusals: s.PreCheckRefusals,
		}
		if res, on := rep.AccelResult(); on {
			ns.Accel = &accelStatus{Commits: res.Commits, Mismatches: res.Mismatches, HandUps: res.HandUps, First: res.First}
		}
		for _, id := range faults.Blocked() {
			ns.Blocked = append(ns.Blocked, uint64(id))
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(ns)
	})
	if faultInjection {
		mux.HandleFunc("/debug/faults", func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				http.Error(w, "POST block=ID,ID (empty heals), delay_persist=DURATION or delay_apply=DURATION", http.StatusMethodNotAllowed)
				return
			}
			// The fields may come in the query string (as the README's
			// curl lines send them) or in a form body.
			if err := r.ParseForm(); err != nil {
				http.Error(w, "bad form: "+err.Error(), http.StatusBadRequest)
				return
			}
			if delayFaults(w, r, faults) { // faults_delay.go
				return
			}
			if !r.Form.Has("block") {
				// Naming nothing must not heal what is blocked.
				http.Error(w, "POST block=ID,ID (empty heals), delay_persist=DURATION or delay_apply=DURATION", http.StatusBadRequest)
				return
			}
			var ids []paxos.NodeID
			for _, f := range strings.Split(r.FormValue("block"), ",") {
				if f = strings.TrimSpace(f); f == "" {
					continue
				}
				id, err := strconv.ParseUint(f, 10, 64)
				if err != nil {
					http.Error(w, fmt.Sprintf("bad peer id %q", f), http.StatusBadRequest)
					return
				}
				// Blocking this node, or an id no member can have, did
				// nothing and answered as if it had. (A valid id that is
				// not a member now is kept: a node about to join can be
				// cut off before it does; the answer says so.)
				switch {
				case paxos.NodeID(id) == rep.Status().ID:
					http.Error(w, fmt.Sprintf("peer %d is this node", id), http.StatusBadRequest)
					return
				case id == 0 || id >= memberIDEnd:
					http.Error(w, fmt.Sprintf("peer %d outside the member ids 1..%d", id, memberIDEnd-1), http.StatusBadRequest)
					return
				}
				ids = append(ids, paxos.NodeID(id))
			}
			faults.Set(ids...)
			st := rep.Status()
			var strangers []paxos.NodeID
			for _, id := range ids {
				if !slices.Contains(st.Members, id) && !slices.Contains(st.Learners, id) {
					strangers = append(strangers, id)
				}
			}
			fmt.Fprintf(w, "blocked %v\n", faults.Blocked())
			if len(strangers) > 0 {
				fmt.Fprintf(w, "not members now (blocked should they join): %v\n", strangers)
			}
		})
	}
	return mux
}

// memberIDEnd is one past the largest member id (docs/protocol.md: member
// ids are 1..63).
const memberIDEnd = 64

// pmemLockWaitMax bounds how long kvnode waits at start for another
// process to let go of its acceptor log (pmem.Options.LockWait): a
// supervisor, or a test's nemesis, that restarts a node the moment it
// SIGKILLed it may find the dead process's lock still held for a few
// milliseconds, and the node used to exit "log file is in use by another
// Log" (seen in an outside nemesis run). A second live kvnode on the
// same log is refused once the wait has passed.
const pmemLockWaitMax = 5 * time.Second

// catchUpLogPercent is consensus.catch_up_log_percent, defaulted by
// parseConfig (nil only in a Config built by hand: the default).
func catchUpLogPercent(p *int) int {
	if p == nil {
		return catchUpLogPercentDefault
	}
	return *p
}

// membersLowOnDisk converts the replica's disk reports for kv/space.
func membersLowOnDisk(rep *replica.Replica) []space.MemberDisk {
	low := rep.MembersLowOnDisk()
	if len(low) == 0 {
		return nil
	}
	out := make([]space.MemberDisk, len(low))
	for i, d := range low {
		out[i] = space.MemberDisk{Node: uint64(d.Node), FreeBytes: d.FreeBytes, ReserveBytes: d.ReserveBytes, ReadFailed: d.ReadFailed}
	}
	return out
}
