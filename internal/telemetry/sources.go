package telemetry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Sources are read at every scrape.
type Sources struct {
	// SandboxStates answers how many sandboxes are in each state now.
	SandboxStates func(ctx context.Context) (map[string]int, error)
	// Sandboxes answers the latest per-sandbox readings.
	Sandboxes func(ctx context.Context) ([]SandboxReading, error)
}

// SandboxReading is one sandbox's readings.
type SandboxReading struct {
	ID, Owner       string
	CPUSeconds      float64 // cumulative busy CPU of its VM, as metered (counter)
	GuestCPUSeconds float64 // cumulative busy CPU seen inside the guest (counter)
	MemoryBytes     int64   // resident memory of its VM (gauge)
	EgressBytes     int64   // cumulative egress bytes (counter)
	ChargedMicros   int64   // cumulative charge in microdollars (counter)
}

const (
	// sourceTimeout bounds each source's answer, well inside Prometheus's
	// default 10 s scrape timeout. A source still running then is
	// abandoned and counted as an error.
	sourceTimeout = 5 * time.Second

	// MaxSandboxSeries is the most sandboxes exported per scrape, five
	// series each; readings past it (in the source's order) are dropped
	// and counted by emberbox_sandbox_readings_dropped. It bounds the
	// exposition should a source answer far more than one host runs.
	MaxSandboxSeries = 10000
)

// Names of the sources in emberbox_scrape_source_errors_total.
const (
	sourceStates    = "sandbox_states"
	sourceSandboxes = "sandboxes"
)

var (
	descSandboxes = prometheus.NewDesc(namespace+"_sandboxes",
		"Sandboxes in each state now.", []string{"state"}, nil)
	sandboxLabels  = []string{"sandbox", "owner"}
	descCPU        = prometheus.NewDesc(namespace+"_sandbox_cpu_seconds_total", "Busy CPU time of the sandbox's VM, as metered.", sandboxLabels, nil)
	descGuestCPU   = prometheus.NewDesc(namespace+"_sandbox_guest_cpu_seconds_total", "Busy CPU time seen inside the sandbox's guest.", sandboxLabels, nil)
	descMemory     = prometheus.NewDesc(namespace+"_sandbox_memory_bytes", "Resident memory of the sandbox's VM.", sandboxLabels, nil)
	descEgress     = prometheus.NewDesc(namespace+"_sandbox_egress_bytes_total", "Bytes the sandbox sent out.", sandboxLabels, nil)
	descCharged    = prometheus.NewDesc(namespace+"_sandbox_charged_microdollars_total", "What the sandbox has been charged, in microdollars.", sandboxLabels, nil)
	descDropped    = prometheus.NewDesc(namespace+"_sandbox_readings_dropped", "Sandbox readings left out of the last scrape by the cap on per-sandbox series.", nil, nil)
	perSandboxDesc = []*prometheus.Desc{descCPU, descGuestCPU, descMemory, descEgress, descCharged}
)

// sourceCollector exports the readings of Sources, taken at every scrape.
// It owns the source error counter so that an error shows in the same
// scrape it happened in.
type sourceCollector struct {
	sources *atomic.Pointer[Sources]
	errs    *prometheus.CounterVec
}

func newSourceCollector(s *atomic.Pointer[Sources]) *sourceCollector {
	c := &sourceCollector{
		sources: s,
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "scrape_source_errors_total",
			Help: "Readings that failed or timed out at a scrape, by source.",
		}, []string{"source"}),
	}
	c.errs.WithLabelValues(sourceStates)
	c.errs.WithLabelValues(sourceSandboxes)
	return c
}

func (c *sourceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descSandboxes
	for _, d := range perSandboxDesc {
		ch <- d
	}
	ch <- descDropped
	c.errs.Describe(ch)
}

func (c *sourceCollector) Collect(ch chan<- prometheus.Metric) {
	defer c.errs.Collect(ch)
	s := c.sources.Load()
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), sourceTimeout)
	defer cancel()
	var wg sync.WaitGroup
	if s.SandboxStates != nil {
		wg.Go(func() {
			states, err := read(ctx, s.SandboxStates)
			if err != nil {
				c.errs.WithLabelValues(sourceStates).Inc()
				return
			}
			for state, n := range states {
				ch <- prometheus.MustNewConstMetric(descSandboxes, prometheus.GaugeValue, float64(n), state)
			}
		})
	}
	if s.Sandboxes != nil {
		wg.Go(func() {
			readings, err := read(ctx, s.Sandboxes)
			if err != nil {
				c.errs.WithLabelValues(sourceSandboxes).Inc()
				return
			}
			collectSandboxes(ch, readings)
		})
	}
	wg.Wait()
}

// collectSandboxes sends the series of at most MaxSandboxSeries readings.
func collectSandboxes(ch chan<- prometheus.Metric, readings []SandboxReading) {
	seen := make(map[string]bool, min(len(readings), MaxSandboxSeries))
	dropped := 0
	for _, r := range readings {
		// A repeated id would make the whole gather fail as a duplicate.
		if seen[r.ID] {
			continue
		}
		if len(seen) == MaxSandboxSeries {
			dropped++
			continue
		}
		seen[r.ID] = true
		values := []struct {
			desc *prometheus.Desc
			typ  prometheus.ValueType
			v    float64
		}{
			{descCPU, prometheus.CounterValue, r.CPUSeconds},
			{descGuestCPU, prometheus.CounterValue, r.GuestCPUSeconds},
			{descMemory, prometheus.GaugeValue, float64(r.MemoryBytes)},
			{descEgress, prometheus.CounterValue, float64(r.EgressBytes)},
			{descCharged, prometheus.CounterValue, float64(r.ChargedMicros)},
		}
		for _, v := range values {
			// Only label values that are not UTF-8 fail here; such a
			// reading is left out rather than failing the gather.
			if m, err := prometheus.NewConstMetric(v.desc, v.typ, v.v, r.ID, r.Owner); err == nil {
				ch <- m
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(descDropped, prometheus.GaugeValue, float64(dropped))
}

// read calls source with ctx, giving up when ctx ends even if the source
// does not: a stuck source must not hold the scrape.
func read[T any](ctx context.Context, source func(context.Context) (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1) // the abandoned call's answer goes nowhere
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- result{err: fmt.Errorf("telemetry source panicked: %v", p)}
			}
		}()
		v, err := source(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, errors.Join(errors.New("telemetry source did not answer in time"), ctx.Err())
	}
}
