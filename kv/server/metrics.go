package server

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the server's Stats as Prometheus metrics:
//
//	synod_client_conns{state="authenticated"|"unauthenticated"}
//	synod_client_conns_refused_total       a connection cap refused a connection
//	synod_client_conns_evicted_total       pre-HELLO connections closed to make room
//	synod_client_accepts_failed_total      accept errors waited out (out of file descriptors)
//	synod_client_response_bytes            response bytes reserved or unwritten (node)
//	synod_client_response_bytes_peak       the most it held
//	synod_client_request_bytes             request body bytes read and not yet answered (node)
//	synod_client_request_bytes_peak        the most it held
//	synod_client_responses_throttled_total THROTTLED for want of response or request budget
//	synod_client_frames_paced_total        frames read a retry-after late: their connection's answers were all THROTTLED
//	synod_client_conns_paced_at_hello_total connections paced from HELLO on: their tenant was being paced
//	synod_client_log_lines_suppressed_total
//	synod_tenant_response_bytes{tenant}   the tenant's share of synod_client_response_bytes
//	synod_tenant_request_bytes{tenant}    the tenant's share of synod_client_request_bytes
//	synod_tenant_budget_throttled_total{tenant}
//	                                       the tenant's share of synod_client_responses_throttled_total
//
// The tenant series carry the registry's tenant names (a bounded label
// set), as the other synod_tenant_* series do.
func (s *Server) Collector() prometheus.Collector {
	return &collector{s: s,
		conns:        prometheus.NewDesc("synod_client_conns", "Client connections open, by state.", []string{"state"}, nil),
		refused:      prometheus.NewDesc("synod_client_conns_refused_total", "Client connections refused by a connection cap.", nil, nil),
		evicted:      prometheus.NewDesc("synod_client_conns_evicted_total", "Pre-HELLO connections closed to make room for newer ones.", nil, nil),
		acceptFailed: prometheus.NewDesc("synod_client_accepts_failed_total", "Accept errors on a client or RESP listener, waited out with a back-off (out of file descriptors, most likely).", nil, nil),
		bytes:        prometheus.NewDesc("synod_client_response_bytes", "Response bytes reserved for requests in flight or not yet written.", nil, nil),
		peak:         prometheus.NewDesc("synod_client_response_bytes_peak", "The most response bytes reserved or unwritten at once.", nil, nil),
		reqBytes:     prometheus.NewDesc("synod_client_request_bytes", "Request body bytes read and not yet answered.", nil, nil),
		reqPeak:      prometheus.NewDesc("synod_client_request_bytes_peak", "The most request body bytes read and not yet answered at once.", nil, nil),
		throttled:    prometheus.NewDesc("synod_client_responses_throttled_total", "Requests answered THROTTLED for want of response or request budget.", nil, nil),
		paced:        prometheus.NewDesc("synod_client_frames_paced_total", "Frames read a retry-after late because their connection's last answers were all THROTTLED (a client not honouring retry-after).", nil, nil),
		pacedHello:   prometheus.NewDesc("synod_client_conns_paced_at_hello_total", "Connections paced from their HELLO on because their tenant had a connection paced within the last second (a flooder reconnecting).", nil, nil),
		suppressed:   prometheus.NewDesc("synod_client_log_lines_suppressed_total", "Log lines about bad connections or requests dropped by the rate limit.", nil, nil),
		tResp:        prometheus.NewDesc("synod_tenant_response_bytes", "Response bytes the tenant's requests hold: reserved for requests in flight or not yet written.", []string{"tenant"}, nil),
		tReq:         prometheus.NewDesc("synod_tenant_request_bytes", "Request body bytes the tenant's requests hold: read and not yet answered.", []string{"tenant"}, nil),
		tThrottled:   prometheus.NewDesc("synod_tenant_budget_throttled_total", "The tenant's requests answered THROTTLED for want of response or request budget.", []string{"tenant"}, nil),
	}
}

type collector struct {
	s                                                                                                               *Server
	conns, refused, evicted, acceptFailed, bytes, peak, reqBytes, reqPeak, throttled, paced, pacedHello, suppressed *prometheus.Desc
	tResp, tReq, tThrottled                                                                                         *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.refused, c.evicted, c.acceptFailed, c.bytes, c.peak, c.reqBytes, c.reqPeak, c.throttled, c.paced, c.pacedHello, c.suppressed, c.tResp, c.tReq, c.tThrottled} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(st.ConnsAuthenticated), "authenticated")
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(st.ConnsUnauthenticated), "unauthenticated")
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(st.ConnsRefused))
	ch <- prometheus.MustNewConstMetric(c.evicted, prometheus.CounterValue, float64(st.ConnsEvicted))
	ch <- prometheus.MustNewConstMetric(c.acceptFailed, prometheus.CounterValue, float64(st.AcceptsFailed))
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.ResponseBytes))
	ch <- prometheus.MustNewConstMetric(c.peak, prometheus.GaugeValue, float64(st.ResponseBytesPeak))
	ch <- prometheus.MustNewConstMetric(c.reqBytes, prometheus.GaugeValue, float64(st.RequestBytes))
	ch <- prometheus.MustNewConstMetric(c.reqPeak, prometheus.GaugeValue, float64(st.RequestBytesPeak))
	ch <- prometheus.MustNewConstMetric(c.throttled, prometheus.CounterValue, float64(st.ResponsesThrottled))
	ch <- prometheus.MustNewConstMetric(c.paced, prometheus.CounterValue, float64(st.FramesPaced))
	ch <- prometheus.MustNewConstMetric(c.pacedHello, prometheus.CounterValue, float64(st.ConnsPacedAtHello))
	ch <- prometheus.MustNewConstMetric(c.suppressed, prometheus.CounterValue, float64(st.LogLinesSuppressed))
	for _, spec := range c.s.reg.All() {
		tb := c.s.TenantBudget(spec.ID)
		ch <- prometheus.MustNewConstMetric(c.tResp, prometheus.GaugeValue, float64(tb.ResponseBytes), spec.Name)
		ch <- prometheus.MustNewConstMetric(c.tReq, prometheus.GaugeValue, float64(tb.RequestBytes), spec.Name)
		ch <- prometheus.MustNewConstMetric(c.tThrottled, prometheus.CounterValue, float64(tb.Throttled), spec.Name)
	}
}
