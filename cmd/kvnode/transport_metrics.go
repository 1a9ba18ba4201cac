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
//	synod_transport_rx_dropped_total{reason="runt"|"truncated"|"bad_checksum"|"foreign"|"kernel_buffer"}
//	synod_transport_tx_ring_full_total
//
// A datagram the transport drops before the replica sees it (above all
// one larger than the receive buffer, "truncated") is counted here and
// nowhere else: an outside tester's oversized datagrams showed in neither
// synod_consensus_auth_refused_total nor synod_inbound_dropped_total.
// "kernel_buffer" (the UDP transport only) is what the kernel dropped
// because the socket's receive buffer was full, read from /proc at each
// scrape: those datagrams never reach the transport at all (an outside
// tester's bursts of replayed packets pushed out 230-344 of 520-1200).
type transportCollector struct {
	conn                       transportStats
	kernel                     kernelDrops // nil: the transport has no kernel socket buffer
	packets, dropped, ringFull *prometheus.Desc
}

// newTransportCollector returns the collector of conn's counters, or nil
// when conn keeps none (the in-memory transport of tests).
func newTransportCollector(conn any) prometheus.Collector {
	ts, ok := conn.(transportStats)
	if !ok {
		return nil
	}
	kd, _ := conn.(kernelDrops)
	return &transportCollector{conn: ts, kernel: kd,
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
	if c.kernel != nil {
		// An unreadable table leaves the series out of this scrape
		// rather than reporting a drop count of 0.
		if n, err := c.kernel.KernelRxDropped(); err == nil {
			ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(n), "kernel_buffer")
		}
	}
	ch <- prometheus.MustNewConstMetric(c.ringFull, prometheus.CounterValue, float64(s.TxRingFull))
}

// kernelDrops is a transport on a kernel socket that can say how many
// datagrams the kernel dropped for it (afxdp.UDPConn).
type kernelDrops interface{ KernelRxDropped() (uint64, error) }
