package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// scrape fetches the exposition of m through its Handler.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: HTTP %d\n%s", resp.StatusCode, body)
	}
	return string(body)
}

// wantLines checks that every line is in the exposition.
func wantLines(t *testing.T, exposition string, lines ...string) {
	t.Helper()
	have := map[string]bool{}
	for l := range strings.SplitSeq(exposition, "\n") {
		have[l] = true
	}
	for _, l := range lines {
		if !have[l] {
			t.Errorf("exposition has no line %q", l)
		}
	}
}

func TestMethods(t *testing.T) {
	m := New()
	m.ObserveRequest("GET /v1/sandboxes/{id}", 200, 30*time.Millisecond)
	m.ObserveRequest("GET /v1/sandboxes/{id}", 200, 2*time.Second)
	m.ObserveRequest("GET /v1/sandboxes/{id}", 404, time.Millisecond)
	m.SandboxOp("create", "ok")
	m.SandboxOp("create", "ok")
	m.SandboxOp("pause", "refused")
	m.ObserveBoot("cold", 1500*time.Millisecond)
	m.LeaseExpired("pause")
	m.EgressRefused("policy")
	m.EgressRefused("policy")

	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"requests 200", testutil.ToFloat64(m.requests.WithLabelValues("GET /v1/sandboxes/{id}", "200")), 2},
		{"requests 404", testutil.ToFloat64(m.requests.WithLabelValues("GET /v1/sandboxes/{id}", "404")), 1},
		{"create ok", testutil.ToFloat64(m.operations.WithLabelValues("create", "ok")), 2},
		{"pause refused", testutil.ToFloat64(m.operations.WithLabelValues("pause", "refused")), 1},
		{"pause ok", testutil.ToFloat64(m.operations.WithLabelValues("pause", "ok")), 0},
		{"lease pause", testutil.ToFloat64(m.leaseExpiries.WithLabelValues("pause")), 1},
		{"lease stop", testutil.ToFloat64(m.leaseExpiries.WithLabelValues("stop")), 0},
		{"egress policy", testutil.ToFloat64(m.egressRefusals.WithLabelValues("policy")), 2},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}

	out := scrape(t, m)
	wantLines(t, out,
		`emberbox_http_request_duration_seconds_count{code="200",route="GET /v1/sandboxes/{id}"} 2`,
		`emberbox_http_request_duration_seconds_bucket{code="200",route="GET /v1/sandboxes/{id}",le="0.05"} 1`,
		`emberbox_http_request_duration_seconds_bucket{code="200",route="GET /v1/sandboxes/{id}",le="2.5"} 2`,
		`emberbox_boot_duration_seconds_count{kind="cold"} 1`,
		`emberbox_boot_duration_seconds_sum{kind="cold"} 1.5`,
		`emberbox_boot_duration_seconds_bucket{kind="cold",le="1"} 0`,
		`emberbox_boot_duration_seconds_bucket{kind="cold",le="2.5"} 1`,
		`emberbox_boot_duration_seconds_count{kind="restore"} 0`,
		`emberbox_boot_duration_seconds_bucket{kind="cold",le="300"} 1`,
		`emberbox_boot_duration_seconds_bucket{kind="cold",le="0.05"} 0`,
	)
	// The Go runtime and process collectors are on the registry too.
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if !strings.Contains(out, "\n"+name+" ") {
			t.Errorf("exposition has no %s", name)
		}
	}
}

func TestSourcesReadAtScrape(t *testing.T) {
	m := New()
	var calls atomic.Int32
	var running atomic.Int32
	running.Store(2)
	m.SetSources(Sources{
		SandboxStates: func(ctx context.Context) (map[string]int, error) {
			calls.Add(1)
			if _, ok := ctx.Deadline(); !ok {
				t.Error("source called without a deadline")
			}
			return map[string]int{"running": int(running.Load()), "paused": 0}, nil
		},
		Sandboxes: func(ctx context.Context) ([]SandboxReading, error) {
			calls.Add(1)
			return []SandboxReading{
				{ID: "sbx_a", Owner: "key_1", CPUSeconds: 12.5, GuestCPUSeconds: 11, MemoryBytes: 1 << 20, EgressBytes: 4096, ChargedMicros: 1500},
				{ID: "sbx_a", Owner: "key_1", CPUSeconds: 99}, // a repeat is left out, not a failed gather
			}, nil
		},
	})
	if n := calls.Load(); n != 0 {
		t.Fatalf("sources read %d times before any scrape", n)
	}
	wantLines(t, scrape(t, m),
		`emberbox_sandboxes{state="running"} 2`,
		`emberbox_sandboxes{state="paused"} 0`,
		`emberbox_sandbox_cpu_seconds_total{owner="key_1",sandbox="sbx_a"} 12.5`,
		`emberbox_sandbox_guest_cpu_seconds_total{owner="key_1",sandbox="sbx_a"} 11`,
		`emberbox_sandbox_memory_bytes{owner="key_1",sandbox="sbx_a"} 1.048576e+06`,
		`emberbox_sandbox_egress_bytes_total{owner="key_1",sandbox="sbx_a"} 4096`,
		`emberbox_sandbox_charged_microdollars_total{owner="key_1",sandbox="sbx_a"} 1500`,
		`emberbox_sandbox_readings_dropped 0`,
		`emberbox_scrape_source_errors_total{source="sandbox_states"} 0`,
	)
	if n := calls.Load(); n != 2 {
		t.Errorf("sources read %d times in one scrape, want 2", n)
	}
	running.Store(3)
	wantLines(t, scrape(t, m), `emberbox_sandboxes{state="running"} 3`)
}

func TestSourceErrors(t *testing.T) {
	m := New()
	m.SetSources(Sources{
		SandboxStates: func(context.Context) (map[string]int, error) {
			return map[string]int{"running": 1}, errors.New("database is locked")
		},
		Sandboxes: func(context.Context) ([]SandboxReading, error) { panic("boom") },
	})
	out := scrape(t, m)
	wantLines(t, out,
		`emberbox_scrape_source_errors_total{source="sandbox_states"} 1`,
		`emberbox_scrape_source_errors_total{source="sandboxes"} 1`,
	)
	for _, name := range []string{"emberbox_sandboxes{", "emberbox_sandbox_cpu_seconds_total{", "emberbox_sandbox_readings_dropped "} {
		if strings.Contains(out, name) {
			t.Errorf("a failed source exported %s", name)
		}
	}
	wantLines(t, scrape(t, m), `emberbox_scrape_source_errors_total{source="sandbox_states"} 2`)
}

func TestSourceTimeout(t *testing.T) {
	m := New()
	release := make(chan struct{})
	defer close(release)
	m.SetSources(Sources{
		// Ignores its context: the scrape must not wait for it.
		Sandboxes: func(context.Context) ([]SandboxReading, error) {
			<-release
			return nil, nil
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err := read(ctx, m.sources.Load().Sandboxes)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("read of a stuck source: %v, want DeadlineExceeded", err)
	}
}

func TestSandboxSeriesCap(t *testing.T) {
	m := New()
	readings := make([]SandboxReading, MaxSandboxSeries+7)
	for i := range readings {
		readings[i] = SandboxReading{ID: fmt.Sprintf("sbx_%d", i), Owner: "key_1"}
	}
	m.SetSources(Sources{Sandboxes: func(context.Context) ([]SandboxReading, error) { return readings, nil }})
	if n := testutil.CollectAndCount(newSourceCollector(&m.sources), "emberbox_sandbox_memory_bytes"); n != MaxSandboxSeries {
		t.Errorf("%d memory series, want the cap %d", n, MaxSandboxSeries)
	}
	wantLines(t, scrape(t, m), `emberbox_sandbox_readings_dropped 7`)
}

func TestNil(t *testing.T) {
	var m *Metrics
	m.ObserveRequest("GET /healthz", 200, time.Second)
	m.SandboxOp("create", "ok")
	m.ObserveBoot("cold", time.Second)
	m.LeaseExpired("stop")
	m.EgressRefused("policy")
	m.SetSources(Sources{})
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != http.StatusNotFound {
		t.Errorf("nil Handler: HTTP %d, want 404", w.Code)
	}
}

func TestLint(t *testing.T) {
	m := New()
	touchAll(m)
	scrape(t, m) // the handler adds its own error counter
	problems, err := testutil.GatherAndLint(m.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// touchAll gives every metric of m a series.
func touchAll(m *Metrics) {
	m.ObserveRequest("GET /v1/sandboxes/{id}", 200, time.Millisecond)
	m.SandboxOp("create", "ok")
	m.ObserveBoot("cold", time.Second)
	m.LeaseExpired("stop")
	m.EgressRefused("policy")
	m.SetSources(Sources{
		SandboxStates: func(context.Context) (map[string]int, error) { return map[string]int{"running": 1}, nil },
		Sandboxes: func(context.Context) ([]SandboxReading, error) {
			return []SandboxReading{{ID: "sbx_a", Owner: "key_1", CPUSeconds: 1, MemoryBytes: 1}}, nil
		},
	})
}
