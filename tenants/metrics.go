package tenants

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ThrottleReason labels the throttled counter.
type ThrottleReason string

const (
	ThrottleRate  ThrottleReason = "rate"  // a token bucket was short
	ThrottleQueue ThrottleReason = "queue" // the tenant's DRR queue was full
)

// Metrics are the per-tenant series, labelled by tenant name (a bounded
// label set: the registry's tenants plus "unknown"). The runtime registers
// it on the admin address's registry: reg.MustRegister(m). All methods are
// safe on a nil *Metrics (they do nothing), so metrics stay optional.
type Metrics struct {
	names     map[ID]string // fixed at NewMetrics
	ops       *prometheus.CounterVec
	bytes     *prometheus.CounterVec
	throttled *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	// info is 1 for every tenant, labelled with its id and priority
	// class, so a query can select tenants by class (an alert on the
	// throttling of critical tenants joins on it).
	info *prometheus.GaugeVec
}

// classLabels are the priority label values of synod_tenant_info, by Class.
var classLabels = [...]string{ClassCritical: "critical", ClassStandard: "standard", ClassBulk: "bulk"}

const unknownTenantLabel = "unknown"

// The per-tenant latency histogram's buckets: latencyBucketsCount bounds
// from latencyBucketFirstSeconds, each latencyBucketFactor times the one
// before (the last about 1.28 s; slower lands in +Inf).
const (
	latencyBucketFirstSeconds = 10e-6
	latencyBucketFactor       = 1.5
	latencyBucketsCount       = 30
)

// NewMetrics creates the collectors for reg's tenants.
func NewMetrics(reg *Registry) *Metrics {
	m := &Metrics{
		names: map[ID]string{},
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "synod", Subsystem: "tenant", Name: "ops_total",
			Help: "Client frames admitted, per tenant.",
		}, []string{"tenant"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "synod", Subsystem: "tenant", Name: "bytes_total",
			Help: "Client frame bytes admitted, per tenant.",
		}, []string{"tenant"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "synod", Subsystem: "tenant", Name: "throttled_total",
			Help: "Client frames answered THROTTLED, per tenant and reason (rate, queue).",
		}, []string{"tenant", "reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "synod", Subsystem: "tenant", Name: "latency_seconds",
			Help: "Per-tenant latency by stage: queue (admission to proposer), service (admission to reply).",
			// 10 µs .. ~1.3 s, each bound 1.5x the one before (as the
			// stage histograms): a quantile read from them (kvbench's
			// in-store figures) is within a factor of 1.5, not 2.
			Buckets: prometheus.ExponentialBuckets(latencyBucketFirstSeconds, latencyBucketFactor, latencyBucketsCount),
		}, []string{"tenant", "stage"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "synod", Subsystem: "tenant", Name: "info",
			Help: "1 for each configured tenant, with its id and priority class.",
		}, []string{"tenant", "id", "priority"}),
	}
	for _, sp := range reg.All() {
		m.names[sp.ID] = sp.Name
		class := "unknown"
		if int(sp.Priority) < len(classLabels) {
			class = classLabels[sp.Priority]
		}
		m.info.WithLabelValues(sp.Name, strconv.FormatUint(uint64(sp.ID), 10), class).Set(1)
		// The throttled series exist from the start, so a rate over them
		// sees the first refusal (a series born at 1 shows no increase).
		for _, why := range []ThrottleReason{ThrottleRate, ThrottleQueue} {
			m.throttled.WithLabelValues(sp.Name, string(why))
		}
	}
	return m
}

func (m *Metrics) name(id ID) string {
	if n, ok := m.names[id]; ok {
		return n
	}
	return unknownTenantLabel
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.ops.Describe(ch)
	m.bytes.Describe(ch)
	m.throttled.Describe(ch)
	m.latency.Describe(ch)
	m.info.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.ops.Collect(ch)
	m.bytes.Collect(ch)
	m.throttled.Collect(ch)
	m.latency.Collect(ch)
	m.info.Collect(ch)
}

// Admitted counts one admitted frame.
func (m *Metrics) Admitted(id ID, frameBytes int) {
	if m == nil {
		return
	}
	n := m.name(id)
	m.ops.WithLabelValues(n).Inc()
	m.bytes.WithLabelValues(n).Add(float64(max(frameBytes, 0)))
}

// Throttled counts one refused frame.
func (m *Metrics) Throttled(id ID, why ThrottleReason) {
	if m == nil {
		return
	}
	m.throttled.WithLabelValues(m.name(id), string(why)).Inc()
}

// ObserveQueue records how long an item waited in the tenant's queue.
func (m *Metrics) ObserveQueue(id ID, d time.Duration) {
	if m == nil {
		return
	}
	m.latency.WithLabelValues(m.name(id), "queue").Observe(d.Seconds())
}

// ObserveService records admission-to-reply latency (the runtime calls it
// when it answers the client).
func (m *Metrics) ObserveService(id ID, d time.Duration) {
	if m == nil {
		return
	}
	m.latency.WithLabelValues(m.name(id), "service").Observe(d.Seconds())
}

var _ prometheus.Collector = (*Metrics)(nil)
