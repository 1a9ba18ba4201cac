package resp

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the RESP endpoint's figures (the ones INFO shows) and
// its command latency as Prometheus metrics:
//
//	synod_resp_conns                    connections open
//	synod_resp_conns_total              connections accepted
//	synod_resp_commands_total           commands executed
//	synod_resp_proxied_total            backend requests forwarded to the leader
//	synod_resp_error_replies_total      error replies
//	synod_resp_auth_failures_total      AUTH or HELLO AUTH with a wrong token
//	synod_resp_protocol_errors_total    connections closed on a protocol error
//	synod_resp_command_latency_seconds  from a command's dispatch to its answer
//
// The connection caps, response budgets and THROTTLED answers RESP shares
// with the binary protocol are the client server's (synod_client_*).
func (s *Server) Collector() prometheus.Collector {
	return &collector{s: s,
		conns:     prometheus.NewDesc("synod_resp_conns", "RESP connections open.", nil, nil),
		connsTot:  prometheus.NewDesc("synod_resp_conns_total", "RESP connections accepted.", nil, nil),
		commands:  prometheus.NewDesc("synod_resp_commands_total", "RESP commands executed.", nil, nil),
		proxied:   prometheus.NewDesc("synod_resp_proxied_total", "Backend requests of RESP commands forwarded to the leader.", nil, nil),
		errors:    prometheus.NewDesc("synod_resp_error_replies_total", "RESP error replies.", nil, nil),
		authFail:  prometheus.NewDesc("synod_resp_auth_failures_total", "RESP AUTH or HELLO AUTH with a wrong token.", nil, nil),
		protoErrs: prometheus.NewDesc("synod_resp_protocol_errors_total", "RESP connections closed on a protocol error.", nil, nil),
	}
}

// newLatency is the RESP command latency histogram (the buckets of the
// replica's stage histograms: 10 us to ~1.9 s).
func newLatency() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "synod_resp_command_latency_seconds",
		Help:    "RESP command latency from dispatch to answer (before it is written).",
		Buckets: prometheus.ExponentialBuckets(10e-6, 1.5, 30),
	})
}

// observe records one command's latency since start.
func (s *Server) observe(start time.Time) { s.latency.Observe(time.Since(start).Seconds()) }

type collector struct {
	s                                                               *Server
	conns, connsTot, commands, proxied, errors, authFail, protoErrs *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.connsTot, c.commands, c.proxied, c.errors, c.authFail, c.protoErrs} {
		ch <- d
	}
	c.s.latency.Describe(ch)
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := &c.s.stats
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(st.conns.Load()))
	for _, m := range []struct {
		d *prometheus.Desc
		v uint64
	}{
		{c.connsTot, st.connsTotal.Load()}, {c.commands, st.commands.Load()}, {c.proxied, st.proxied.Load()},
		{c.errors, st.errors.Load()}, {c.authFail, st.authFailures.Load()}, {c.protoErrs, st.protocolError.Load()},
	} {
		ch <- prometheus.MustNewConstMetric(m.d, prometheus.CounterValue, float64(m.v))
	}
	c.s.latency.Collect(ch)
}
