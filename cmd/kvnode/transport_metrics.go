package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"synod/afxdp"
)

// transportStats is what the consensus transports (UDPConn, XDPConn)
// report: their packet counters.
type transportStats interface{ Stats() afxdp.Counters }

// transportCollector exports the consensus transport's packet counters:
//
//	synod_transport_packets_total{dir="rx"|"tx"}
//	synod_transport_rx_dropped_total{reason="runt"|"truncated"|"bad_checksum"|"foreign"}
//	synod_transport_tx_ring_full_total
//
// A datagram the transport drops before the replica sees it (above all
// one larger than the receive buffer, "truncated") is counted here and
// nowhere else: an outside tester's oversized datagrams showed in neither
// synod_consensus_auth_refused_total nor synod_inbound_dropped_total.
type transportCollector struct {
	conn                       transportStats
	packets, dropped, ringFull *prometheus.Desc
}

// newTransportCollector returns the collector of conn's counters, or nil
// when conn keeps none (the in-memory transport of tests).
func newTransportCollector(conn any) prometheus.Collector {
	ts, ok := conn.(transportStats)
	if !ok {
		return nil
	}
	return &transportCollector{conn: ts,
		packets:  prometheus.NewDesc("synod_transport_packets_total", "Consensus datagrams the transport delivered (rx) or handed to the network (tx).", []string{"dir"}, nil),
		dropped:  prometheus.NewDesc("synod_transport_rx_dropped_total", "Datagrams the consensus transport dropped before the replica saw them, by reason (truncated: larger than the receive buffer).", []string{"reason"}, nil),
		ringFull: prometheus.NewDesc("synod_transport_tx_ring_full_total", "AF_XDP sends that found no free frame or ring slot (retried, not lost).", nil, nil),
	}
}

func (c *transportCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.packets
	ch <- c.dropped
	ch <- c.ringFull
}

func (c *transportCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.conn.Stats()
	ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(s.RxPackets), "rx")
	ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(s.TxPackets), "tx")
	for _, d := range []struct {
		reason string
		n      uint64
	}{{"runt", s.RxRunt}, {"truncated", s.RxTruncated}, {"bad_checksum", s.RxBadChecksum}, {"foreign", s.RxForeign}} {
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(d.n), d.reason)
	}
	ch <- prometheus.MustNewConstMetric(c.ringFull, prometheus.CounterValue, float64(s.TxRingFull))
}
