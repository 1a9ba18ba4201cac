package replica

import (
	"github.com/prometheus/client_golang/prometheus"
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
	// AnswerMismatches counts committed commands that named a waiting
	// writer of this boot but were not its command (never answered; a
	// non-zero value is a bug).
	AnswerMismatches prometheus.Counter
	// AuthRefused counts consensus datagrams, and side-channel
	// connections, refused by authentication (auth.go): forged, from a
	// node without the cluster secret, from another cluster, or replayed.
	AuthRefused prometheus.Counter
	// Shed counts client requests the overload guard refused, by the
	// tenant's priority class.
	Shed *prometheus.CounterVec
}

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
			Name: "synod_leader_changes_total", Help: "Times the leader this replica knows of changed."}),
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
		LogFull: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_log_full_total", Help: "Appends refused because the acceptor log was full."}),
		AnswerMismatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_answer_mismatches_total", Help: "Committed commands that named a waiting writer but were not its command (a bug if non-zero)."}),
		AuthRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_consensus_auth_refused_total", Help: "Consensus datagrams and side-channel connections refused by authentication (forged, wrong secret, other cluster, replayed)."}),
		Shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "synod_overload_shed_total", Help: "Client requests refused THROTTLED by the overload guard, by priority class."}, []string{"class"}),
	}
	if reg != nil {
		reg.MustRegister(m.CommitLatency, m.ReadLatency, m.LeaderChanges, m.TenantOps, m.Applied, m.Commit,
			m.InboundDropped, m.OutboundDropped, m.Snapshots, m.Installed, m.SideSent, m.LogFull, m.AnswerMismatches, m.AuthRefused, m.Shed)
	}
	return m
}
