package replica

import "github.com/prometheus/client_golang/prometheus"

// snapshotMetrics are the series of snapshot transfers (snapshot_*.go).
type snapshotMetrics struct {
	// SentBytes and ReceivedBytes count snapshot stream bytes sent to and
	// received from peers (chunk data, framing excluded).
	SentBytes, ReceivedBytes prometheus.Counter
	// Seconds is the duration of transfers by direction ("sent",
	// "received"; a received one ends when its state is installed).
	Seconds *prometheus.HistogramVec
	// InFlight is the transfers running now, by direction.
	InFlight *prometheus.GaugeVec
	// Transfers counts ended transfers by direction and result ("ok",
	// "failed", "stale": superseded or arrived late, "refused").
	Transfers *prometheus.CounterVec
	// DeltaRanges counts the digest ranges of installed delta transfers,
	// by what the server did with them ("kept": the fetcher had them,
	// "replaced": sent).
	DeltaRanges *prometheus.CounterVec
}

// Label values of snapshotMetrics.
const (
	dirSent       = "sent"
	dirReceived   = "received"
	resultOK      = "ok"
	resultFailed  = "failed"
	resultStale   = "stale"
	resultRefused = "refused"
	resultNoSpace = "no_space" // received: aborted at the disk reserve (snapshot_room.go)

	rangesKept     = "kept"
	rangesReplaced = "replaced"
)

func newSnapshotMetrics(reg prometheus.Registerer) snapshotMetrics {
	m := snapshotMetrics{
		SentBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_snapshot_sent_bytes_total", Help: "Snapshot stream bytes sent to lagging peers."}),
		ReceivedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "synod_snapshot_received_bytes_total", Help: "Snapshot stream bytes received from peers and staged."}),
		Seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "synod_snapshot_transfer_seconds", Help: "Duration of snapshot transfers, by direction (a received one until its state is installed).",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16)}, []string{"direction"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "synod_snapshot_transfers_in_flight", Help: "Snapshot transfers running now, by direction."}, []string{"direction"}),
		Transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "synod_snapshot_transfers_total", Help: "Ended snapshot transfers by direction and result (ok, failed, stale, refused, no_space: a received one stopped at this node's disk reserve)."},
			[]string{"direction", "result"}),
		DeltaRanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "synod_snapshot_delta_ranges_total", Help: "Digest ranges of installed delta snapshot transfers, by what the server did: kept (the fetcher had them) or replaced (sent)."},
			[]string{"what"}),
	}
	m.DeltaRanges.WithLabelValues(rangesKept)
	m.DeltaRanges.WithLabelValues(rangesReplaced)
	for _, d := range []string{dirSent, dirReceived} {
		m.Seconds.WithLabelValues(d)
		m.InFlight.WithLabelValues(d)
		for _, res := range []string{resultOK, resultFailed, resultStale, resultRefused, resultNoSpace} {
			m.Transfers.WithLabelValues(d, res)
		}
	}
	if reg != nil {
		reg.MustRegister(m.SentBytes, m.ReceivedBytes, m.Seconds, m.InFlight, m.Transfers, m.DeltaRanges)
	}
	return m
}
