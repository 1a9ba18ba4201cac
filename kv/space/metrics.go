package space

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the guard's counters and every configured tenant's
// usage (one series per tenant of the registry: at most
// tenants.TenantsMax).
type collector struct {
	g                                                               *Guard
	refused, free, stored, keys, quotaDesc, compactions, membersLow *prometheus.Desc
}

// Collector returns the guard's Prometheus collector:
// synod_space_refused_total{reason="quota"|"disk"|"member_disk"},
// synod_space_members_below_reserve, synod_disk_free_bytes,
// synod_space_compactions_total, and per tenant (labelled by name, as the
// other synod_tenant_* series) synod_tenant_stored_bytes,
// synod_tenant_stored_keys and synod_tenant_quota_bytes (0: none).
func (g *Guard) Collector() prometheus.Collector {
	return &collector{
		g:           g,
		refused:     prometheus.NewDesc("synod_space_refused_total", "Writes answered NO_SPACE, by reason: quota (past the tenant's quota_bytes), disk (this node below disk_free_min_bytes) or member_disk (another member reported its disk below its reserve).", []string{"reason"}, nil),
		membersLow:  prometheus.NewDesc("synod_space_members_below_reserve", "Other members whose latest disk report (within 5 s) says their disk is below their reserve; while above 0 the leader refuses writes that grow the store.", nil, nil),
		free:        prometheus.NewDesc("synod_disk_free_bytes", "Free bytes of data_dir's filesystem at the last reading (read at most every 250 ms, by writes while the reserve is on and by each scrape; absent while the reading fails).", nil, nil),
		stored:      prometheus.NewDesc("synod_tenant_stored_bytes", "What the tenant stores as its quota counts it: user keys + values + 16 bytes per key, as of the last apply on this node.", []string{"tenant"}, nil),
		keys:        prometheus.NewDesc("synod_tenant_stored_keys", "Keys the tenant stores, as of the last apply on this node.", []string{"tenant"}, nil),
		quotaDesc:   prometheus.NewDesc("synod_tenant_quota_bytes", "The tenant's storage quota (quota_bytes); 0: none.", []string{"tenant"}, nil),
		compactions: prometheus.NewDesc("synod_space_compactions_total", "Compactions of the whole store run because the disk was short of space and values had been deleted or replaced.", nil, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.refused
	ch <- c.free
	ch <- c.stored
	ch <- c.keys
	ch <- c.quotaDesc
	ch <- c.compactions
	ch <- c.membersLow
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.g.refreshFree()
	st := c.g.Stats()
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(st.RefusedQuota), "quota")
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(st.RefusedDisk), "disk")
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(st.RefusedMemberDisk), "member_disk")
	ch <- prometheus.MustNewConstMetric(c.membersLow, prometheus.GaugeValue, float64(st.MembersLow))
	ch <- prometheus.MustNewConstMetric(c.compactions, prometheus.CounterValue, float64(st.Compactions))
	if st.FreeBytes >= 0 {
		ch <- prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, float64(st.FreeBytes))
	}
	for _, spec := range c.g.cfg.Registry.All() {
		id := spec.Name
		u := c.g.cfg.Ledger.Usage(spec.ID)
		ch <- prometheus.MustNewConstMetric(c.stored, prometheus.GaugeValue, float64(u.Bytes), id)
		ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(u.Keys), id)
		ch <- prometheus.MustNewConstMetric(c.quotaDesc, prometheus.GaugeValue, float64(spec.QuotaBytes), id)
	}
}
