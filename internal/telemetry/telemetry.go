// Package telemetry holds the server's Prometheus metrics: API requests,
// sandbox lifecycle operations, boot times, lease expiries, egress refusals,
// and readings taken from the server at every scrape (sandboxes by state, each
// sandbox's CPU, memory, egress and charge).
//
// The metrics live on a registry of their own, with the Go runtime and process
// collectors, so that nothing registered on the global default registry by a
// library leaks into the exposition. A nil *Metrics is valid and records
// nothing, so callers need no nil checks.
//
// Per-sandbox series are capped at `MaxSandboxSeries`.
// `deploy/grafana/emberbox.json` is a dashboard over these metrics, checked by
// a test against the registry.
package telemetry

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const namespace = "emberbox"

// Label values the callers use, created up front so that every series
// exists (at 0) from the first scrape and rate() sees its first increment.
var (
	ops         = []string{"create", "stop", "delete", "pause", "wake", "restart", "snapshot", "fork"}
	outcomes    = []string{"ok", "error", "refused"}
	bootKinds   = []string{"cold", "template", "restore", "fork", "restart"}
	leaseAction = []string{"stop", "pause", "delete"}
)

// Metrics is the server's metrics. Its methods are safe for concurrent use
// and do nothing on a nil *Metrics.
type Metrics struct {
	reg *prometheus.Registry

	requests        *prometheus.CounterVec
	requestDuration *prometheus.HistogramVec
	operations      *prometheus.CounterVec
	boot            *prometheus.HistogramVec
	leaseExpiries   *prometheus.CounterVec
	egressRefusals  *prometheus.CounterVec

	sources atomic.Pointer[Sources]
}

// New returns Metrics registered on a new registry together with the Go
// runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "http_requests_total",
			Help: "API requests answered, by route pattern and HTTP status code.",
		}, []string{"route", "code"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "http_request_duration_seconds",
			Help: "Time to answer an API request, by route pattern and HTTP status code.",
			// Up to 2 minutes: Prefer: wait and long polls hold requests
			// that long by design.
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"route", "code"}),
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "sandbox_operations_total",
			Help: "Sandbox lifecycle operations, by operation and outcome (ok, error, refused).",
		}, []string{"op", "outcome"}),
		boot: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "boot_duration_seconds",
			Help:    "Time from starting a VM to its agent answering, by kind of boot.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"kind"}),
		leaseExpiries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "lease_expiries_total",
			Help: "Sandbox leases that ran out, by the action taken (stop, pause, delete).",
		}, []string{"action"}),
		egressRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "egress_refusals_total",
			Help: "Egress connections and lookups refused, by reason.",
		}, []string{"reason"}),
	}
	for _, op := range ops {
		for _, o := range outcomes {
			m.operations.WithLabelValues(op, o)
		}
	}
	for _, k := range bootKinds {
		m.boot.WithLabelValues(k)
	}
	for _, a := range leaseAction {
		m.leaseExpiries.WithLabelValues(a)
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.requests, m.requestDuration, m.operations, m.boot, m.leaseExpiries, m.egressRefusals,
		newSourceCollector(&m.sources),
	)
	return m
}

// Handler serves the exposition of m's registry. On a nil *Metrics it
// answers 404.
func (m *Metrics) Handler() http.Handler {
	if m == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		// A reading that fails to gather should not hide all the others.
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      m.reg, // promhttp_metric_handler_errors_total
	})
}

// ObserveRequest records one API request: route is the route pattern
// ("GET /v1/sandboxes/{id}"), never the raw path; status the HTTP status.
func (m *Metrics) ObserveRequest(route string, status int, d time.Duration) {
	if m == nil {
		return
	}
	code := strconv.Itoa(status)
	m.requests.WithLabelValues(route, code).Inc()
	m.requestDuration.WithLabelValues(route, code).Observe(d.Seconds())
}

// SandboxOp counts a lifecycle operation: op is create|stop|delete|pause|
// wake|restart|snapshot|fork; outcome is ok|error|refused.
func (m *Metrics) SandboxOp(op, outcome string) {
	if m == nil {
		return
	}
	m.operations.WithLabelValues(op, outcome).Inc()
}

// ObserveBoot records how long a VM took from start to its agent
// answering: kind is cold|template|restore|fork|restart.
func (m *Metrics) ObserveBoot(kind string, d time.Duration) {
	if m == nil {
		return
	}
	m.boot.WithLabelValues(kind).Observe(d.Seconds())
}

// LeaseExpired counts a lease end by its action (stop|pause|delete).
func (m *Metrics) LeaseExpired(action string) {
	if m == nil {
		return
	}
	m.leaseExpiries.WithLabelValues(action).Inc()
}

// EgressRefused counts a refused egress connection or lookup by reason.
func (m *Metrics) EgressRefused(reason string) {
	if m == nil {
		return
	}
	m.egressRefusals.WithLabelValues(reason).Inc()
}

// SetSources sets the readings taken at every scrape, replacing any set
// before. A nil function exports nothing for its metrics.
func (m *Metrics) SetSources(s Sources) {
	if m == nil {
		return
	}
	m.sources.Store(&s)
}
