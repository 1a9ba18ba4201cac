package replica

import (
	"github.com/prometheus/client_golang/prometheus"

	"synod/paxos"
)

// Metrics are the runtime's Prometheus series. Each replica registers its
// own (tests run several replicas in one process with separate registries).
type Metrics struct {
	CommitLatency   prometheus.Histogram // write: proposal to applied result, seconds
	ReadLatency     prometheus.Histogram // linearizable read barrier, seconds
	LeaderChanges   prometheus.Counter
	TenantOps       *prometheus.CounterVec // labels: tenant, op, status
	Applied         prometheus.Gauge
	Commit          prometheus.Gauge
	InboundDropped  prometheus.Counter
	OutboundDropped prometheus.Counter
	Snapshots       prometheus.Counter
	Installed       prometheus.Counter // snapshots received from a leader and restored
	SideSent        prometheus.Counter // messages handed to the TCP side channel
	LogFull         prometheus.Counter
	// ElectionsDeferred counts elections not started for want of log
	// room for the re-proposals (paxos logroom.go).
	ElectionsDeferred prometheus.Counter
	// LogStalls counts Readys that waited for acceptor-log room.
	LogStalls prometheus.Counter
	// OwnWaits counts the leader's own acceptances that waited for
	// acceptor-log room (own_backlog.go).
	OwnWaits prometheus.Counter
	// PreCheckRefusals counts refusals this node's pre-checks received.
	PreCheckRefusals prometheus.Counter
	// ApplyBacklog is the committed batches waiting for room in the apply
	// queue; ApplyBacklogHolds counts the times a leader stopped taking
	// writes because of them (apply_backlog.go).
	ApplyBacklog      prometheus.Gauge
	ApplyBacklogHolds prometheus.Counter
	// AnswerMismatches counts committed commands that named a waiting
	// writer of this boot but were not its command (never answered; a
	// non-zero value is a bug).
	AnswerMismatches prometheus.Counter
	// AuthRefused counts consensus datagrams, and side-channel and
	// snapshot-transfer connections, refused by authentication (auth.go):
	// forged, from a node without the cluster secret, from another
	// cluster, replayed, addressed to another node, or on probation past
	// the deadline for their first whole frame (errUnprovenTimeout).
	AuthRefused prometheus.Counter
	// Shed counts client requests the overload guard refused, by the
	// tenant's priority class.
	Shed *prometheus.CounterVec

	// Leadership and the acceptor's ballot, from the consensus loop's
	// latest paxos status.
	IsLeader      prometheus.Gauge // 1 while this replica leads, else 0
	LeaderID      prometheus.Gauge // the leader this replica knows of (0: none)
	PromisedRound prometheus.Gauge // round of the highest ballot promised
	// LogUsed and LogCapacity are the acceptor log's bytes in use and its
	// ring's size (consensus loop: after each persist and truncation).
	LogUsed     prometheus.Gauge
	LogCapacity prometheus.Gauge
	// SnapshotSlot is the slot of the last snapshot taken or installed;
	// SnapshotBytes that snapshot's size (apply loop).
	SnapshotSlot  prometheus.Gauge
	SnapshotBytes prometheus.Gauge
	// Snap are the snapshot transfer series (snapshot_metrics.go).
	Snap snapshotMetrics
	// Stuck are the progress watch's series (stuck_metrics.go).
	Stuck stuckMetrics
	// Stage times the stages of the write path on this node, by stage
	// (WriteStages; stages.go says what each one times). "persist" is the
	// consensus loop appending and persisting one Ready's accepted entries
	// to the acceptor log (entries the accel fast path persisted on the
	// receive loop are not in it); "apply" is applying one committed slot
	// to the state machine.
	Stage *prometheus.HistogramVec
	// ReadStage times the stages of a linearizable read (ReadStages).
	ReadStage *prometheus.HistogramVec
	// Stalls counts stages that took longer than the stall detector's
	// threshold, by path ("write", "read") and stage (stages.go); without
	// a detector (Config.Stalls nil) nothing is counted.
	Stalls *prometheus.CounterVec
	// stages holds the children of Stage, ReadStage and Stalls;
	// persistSeconds and applySeconds are two of them.
	stages                       stageSeries
	persistSeconds, applySeconds prometheus.Observer
}

// Stage labels of Metrics.Stage.
const (
	stagePersist = "persist"
	stageApply   = "apply"
)

// NewMetrics creates the series and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	lat := prometheus.ExponentialBuckets(10e-6, 1.5, 30) // 10us .. ~1.9s
	m := &Metrics{
		CommitLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "synod_commit_latency_seconds", Help: "Write latency from proposal to applied result on the leader.", Buckets: lat}),
		ReadLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "synod_read_barrier_latency_seconds", Help: "Linearizable read barrier latency (read index, then applied).", Buckets: lat}),
		LeaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_leader_changes_total", Help: "Times the leader this replica knows of changed, to none included: one election usually counts twice (the old leader, then none, then the new one)."}),
		TenantOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "synod_replica_ops_total", Help: "Client operations the replica executed, by tenant id, op and status."}, []string{"tenant", "op", "status"}),
		Applied: prometheus.NewGauge(prometheus.GaugeOpts{Name: "synod_applied_slot", Help: "Highest applied slot."}),
		Commit:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "synod_commit_slot", Help: "Highest committed slot known."}),
		InboundDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_inbound_dropped_total", Help: "Consensus messages dropped on receive (full queue, bad bytes, faults)."}),
		OutboundDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_outbound_dropped_total", Help: "Consensus messages dropped on send."}),
		Snapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_snapshots_total", Help: "Snapshots taken for compaction."}),
		Installed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_snapshots_installed_total", Help: "Snapshots received from a leader and restored."}),
		SideSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_side_channel_sent_total", Help: "Consensus messages too large for a datagram, sent over TCP."}),
		ElectionsDeferred: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_elections_deferred_total", Help: "Elections this node did not start because the entries it would re-propose as leader do not fit in its acceptor log (it catches up first)."}),
		PreCheckRefusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_precheck_refusals_total", Help: "Refusals this node's election pre-checks received: a member had heard from a leader lately, held another's lease, or had committed further (so a lagging node leaves the election to one with less to learn)."}),
		LogStalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_log_full_stalls_total", Help: "Times the consensus loop stalled on a full acceptor log: a Ready waited for room, and the loop took only ticks and control meanwhile (admission makes this rare; see kv/replica/accept_admission.go)."}),
		OwnWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_log_full_own_waits_total", Help: "The leader's own acceptances that did not fit in the acceptor log and waited for room; the Ready went on without them, and the leader's vote for them counted once they were stored (kv/replica/own_backlog.go)."}),
		LogFull: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_log_full_total", Help: "Appends refused because the acceptor log was full."}),
		AnswerMismatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_answer_mismatches_total", Help: "Committed commands that named a waiting writer but were not its command (a bug if non-zero)."}),
		AuthRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_consensus_auth_refused_total", Help: "Consensus datagrams, side-channel and snapshot-transfer connections refused by authentication (forged, wrong secret, other cluster, replayed, addressed to another node, or unproven past their first-frame deadline)."}),
		Shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "synod_overload_shed_total", Help: "Client requests refused THROTTLED by the overload guard, by priority class."}, []string{"class"}),
		ApplyBacklog: prometheus.NewGauge(prometheus.GaugeOpts{Name: "synod_apply_backlog_items",
			Help: "Items (committed batches, consecutive ones merged) waiting for room in the apply queue; the consensus loop goes on meanwhile."}),
		ApplyBacklogHolds: prometheus.NewCounter(prometheus.CounterOpts{Name: "synod_apply_backlog_holds_total",
			Help: "Times this leader stopped taking new writes because its apply backlog passed half its bound."}),
		IsLeader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "synod_is_leader", Help: "1 while this replica is the leader, else 0."}),
		LeaderID: prometheus.NewGauge(prometheus.GaugeOpts{Name: "synod_leader_id", Help: "Node id of the leader this replica knows of (0: none)."}),
		PromisedRound: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "synod_promised_ballot_round", Help: "Round of the highest ballot this replica's acceptor promised."}),
		LogUsed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "synod_acceptor_log_used_bytes", Help: "Bytes of the acceptor log's ring in use (appended and not yet truncated)."}),
		LogCapacity: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "synod_acceptor_log_capacity_bytes", Help: "Size of the acceptor log's ring in bytes; writes are refused when it is full."}),
		SnapshotSlot: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "synod_snapshot_slot", Help: "Slot of the last snapshot taken or installed (0: none yet in this process)."}),
		SnapshotBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "synod_snapshot_bytes", Help: "Size of the last snapshot taken or installed, in bytes."}),
		Stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "synod_write_stage_seconds", Help: "Time spent in a stage of the write path on this node (admission, propose_queue, ready, persist, accept_rtt, commit, apply_queue, apply, reply; see kv/replica/stages.go).",
			Buckets: lat}, []string{"stage"}),
		ReadStage: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "synod_read_stage_seconds", Help: "Time spent in a stage of a linearizable read on this node (admission, read_index, apply_wait, state_machine).",
			Buckets: lat}, []string{"stage"}),
		Stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "synod_stage_stalls_total", Help: "Stages that took longer than the stall threshold ([stall] threshold), by path and stage."}, []string{"path", "stage"}),
	}
	// Every label value of a bounded set exists from the start, so a rate
	// over it sees the first increment (a series born at 1 shows none).
	for _, c := range classNames {
		m.Shed.WithLabelValues(c)
	}
	m.initStages()
	m.Snap = newSnapshotMetrics(reg)
	m.Stuck = newStuckMetrics(reg)
	if reg != nil {
		reg.MustRegister(m.CommitLatency, m.ReadLatency, m.LeaderChanges, m.TenantOps, m.Applied, m.Commit,
			m.InboundDropped, m.OutboundDropped, m.Snapshots, m.Installed, m.SideSent, m.LogFull, m.ElectionsDeferred, m.LogStalls, m.OwnWaits, m.PreCheckRefusals, m.AnswerMismatches, m.AuthRefused, m.Shed, m.ApplyBacklog, m.ApplyBacklogHolds,
			m.IsLeader, m.LeaderID, m.PromisedRound, m.LogUsed, m.LogCapacity, m.SnapshotSlot, m.SnapshotBytes, m.Stage,
			m.ReadStage, m.Stalls)
	}
	return m
}

// setStatus publishes the leadership and ballot gauges of s (consensus
// loop).
func (m *Metrics) setStatus(s *paxos.Status) {
	m.Commit.Set(float64(s.Commit))
	m.LeaderID.Set(float64(s.Leader))
	m.PromisedRound.Set(float64(s.Promised.Round))
	leads := 0.0
	if s.Role == paxos.RoleLeader {
		leads = 1
	}
	m.IsLeader.Set(leads)
}

// setLogUsage publishes the acceptor log's usage.
func (m *Metrics) setLogUsage(used, capacity int64) {
	m.LogUsed.Set(float64(used))
	m.LogCapacity.Set(float64(capacity))
}
