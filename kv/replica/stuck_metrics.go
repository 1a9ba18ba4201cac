package replica

import "github.com/prometheus/client_golang/prometheus"

// stuckMetrics are the series of the progress watch (stuck.go).
type stuckMetrics struct {
	// Stuck is 1 while this node makes no progress with work waiting.
	Stuck prometheus.Gauge
	// Transfers counts what a stuck leader did about it, by result
	// ("started": a hand-over began; "no_target": no voter reported
	// itself able to lead; "refused": paxos did not start the hand-over).
	Transfers *prometheus.CounterVec
}

// stuckTransferResults are the label values of stuckMetrics.Transfers.
var stuckTransferResults = []string{"started", "no_target", "refused"}

func newStuckMetrics(reg prometheus.Registerer) stuckMetrics {
	m := stuckMetrics{
		Stuck: prometheus.NewGauge(prometheus.GaugeOpts{Name: "synod_replica_stuck",
			Help: "1 while this node has made no progress applying or truncating its acceptor log, with work waiting, for 5 s (a stuck leader hands leadership over)."}),
		Transfers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "synod_stuck_leader_transfers_total",
			Help: "What a stuck leader did: started a hand-over, found no voter able to lead (no_target), or had the hand-over refused."}, []string{"result"}),
	}
	for _, r := range stuckTransferResults {
		m.Transfers.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.Stuck, m.Transfers)
	}
	return m
}

func (m *Metrics) setStuck(on bool) {
	v := 0.0
	if on {
		v = 1
	}
	m.Stuck.Stuck.Set(v)
}

func (m *Metrics) stuckTransfer(result string) { m.Stuck.Transfers.WithLabelValues(result).Inc() }
