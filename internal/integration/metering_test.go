package integration

import (
	"fmt"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// usageGroup is one sandbox's part of GET /v1/usage.
type usageGroup struct {
	Key              string `json:"key"`
	RunningSeconds   string `json:"runningSeconds"`
	ActiveCPUSeconds string `json:"activeCpuSeconds"`
	BilledCPUSeconds string `json:"billedCpuSeconds"`
	GuestCPUSeconds  string `json:"guestCpuSeconds"`
	MemoryGiBSeconds string `json:"memoryGiBSeconds"`
	CPUMicros        string `json:"cpuMicros"`
	MemoryMicros     string `json:"memoryMicros"`
	ChargedMicros    string `json:"chargedMicros"`
	Runs             int64  `json:"runs"`
}

func rat(t testing.TB, s string) *big.Rat {
	t.Helper()
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		t.Fatalf("not an exact decimal: %q", s)
	}
	return r
}

func secs(t testing.TB, s string) float64 { f, _ := rat(t, s).Float64(); return f }

// microsOf rounds dollars to microdollars, half away from zero.
func microsOf(dollars *big.Rat) string {
	m := new(big.Rat).Mul(dollars, big.NewRat(1_000_000, 1))
	f, _ := m.Float64()
	return strconv.FormatInt(int64(f+0.5), 10)
}

// TestMetering: a sandbox that burns a known amount of CPU measured inside
// the guest is metered on the host at least that much; one left idle as
// long is charged its memory and only the CPU it burned (the floor at
// least); both are settled exactly when they stop, between samples, and
// their charges follow from their quantities at the published rates.
func TestMetering(t *testing.T) {
	dataDir := t.TempDir()
	s := startServer(t, dataDir)
	c := s.client(s.AdminKey)
	// Both boot together and stop together: the idle one lives as long.
	shape := map[string]any{"vcpu": 1, "memoryMiB": 1024}
	busy := c.create(t, shape, http.Header{"Prefer": {"wait=0"}})
	idle := c.create(t, shape, http.Header{"Prefer": {"wait=0"}})
	c.waitState(t, busy.ID, "running")
	c.waitState(t, idle.ID, "running")

	// Burn 5 CPU-seconds as the guest counts them (process time of the
	// loop), and report it.
	const burn = 5.0
	start := time.Now()
	out := c.sh(t, busy.ID, fmt.Sprintf(`python3 -c '
import time
t = time.process_time()
while time.process_time() - t < %g:
    pass
print(time.process_time() - t)'`, burn))
	guestBurn, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	if err != nil || guestBurn < burn {
		t.Fatalf("the loop reports %q", out)
	}
	t.Logf("guest burned %.2f CPU-s in %v of wall time", guestBurn, time.Since(start).Round(time.Millisecond))

	// While they run, the metrics and Prometheus see them.
	type point struct {
		CPUPercent      *float64 `json:"cpuPercent"`
		GuestCPUPercent *float64 `json:"guestCpuPercent"`
		MemoryBytes     *int64   `json:"memoryBytes"`
	}
	type metrics struct {
		Points []point `json:"points"`
		Latest *point  `json:"latest"`
	}
	// Wait for a settled interval that holds the burn as the guest saw it
	// (the server reads running sandboxes every 15 s).
	var m metrics
	if !waitUntil(2*time.Minute, time.Second, func() bool {
		m, _ = call[metrics](t, c, "GET", "/v1/sandboxes/"+busy.ID+"/metrics?range=15m", nil, nil)
		for _, p := range m.Points {
			if p.GuestCPUPercent != nil && *p.GuestCPUPercent > 0 {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no metrics point with the guest's busy time within two minutes: %+v", m)
	}
	if m.Latest.CPUPercent == nil || *m.Latest.CPUPercent <= 0 || m.Latest.MemoryBytes == nil || *m.Latest.MemoryBytes < 32<<20 {
		t.Errorf("latest metrics point: cpu %v, memory %v", m.Latest.CPUPercent, m.Latest.MemoryBytes)
	}
	prom := c.raw(t, "GET", "/metrics", nil, nil, requestTimeout)
	if prom.Status != http.StatusOK || !strings.Contains(string(prom.Body), `emberbox_sandbox_cpu_seconds_total{owner=`) ||
		!strings.Contains(string(prom.Body), `emberbox_sandboxes{state="running"}`) {
		t.Errorf("/metrics: %d, missing per-sandbox or state series", prom.Status)
	}

	for _, id := range []string{busy.ID, idle.ID} {
		if r := c.raw(t, "POST", "/v1/sandboxes/"+id+":stop", map[string]any{}, nil, requestTimeout); r.Status != http.StatusOK {
			t.Fatalf("stop %s: %v", id, r)
		}
	}
	c.waitState(t, busy.ID, "stopped")
	c.waitState(t, idle.ID, "stopped")
	type usage struct {
		Groups []usageGroup `json:"groups"`
	}
	u, _ := call[usage](t, c, "GET", "/v1/usage", nil, nil)
	got := map[string]usageGroup{}
	for _, g := range u.Groups {
		got[g.Key] = g
	}
	b, i := got[busy.ID], got[idle.ID]
	t.Logf("busy: running %s s, host cpu %s s, guest cpu %s s, memory %s GiB-s, charged %s µ$",
		b.RunningSeconds, b.ActiveCPUSeconds, b.GuestCPUSeconds, b.MemoryGiBSeconds, b.ChargedMicros)
	t.Logf("idle: running %s s, host cpu %s s, guest cpu %s s, memory %s GiB-s, charged %s µ$",
		i.RunningSeconds, i.ActiveCPUSeconds, i.GuestCPUSeconds, i.MemoryGiBSeconds, i.ChargedMicros)

	// The host meter holds at least what the guest burned (a vCPU thread
	// runs it, and under emulation far more) and at most every host core
	// for the whole run.
	host, running := secs(t, b.ActiveCPUSeconds), secs(t, b.RunningSeconds)
	if host < 0.9*guestBurn || host > 2*running {
		t.Errorf("host cpu %.2f s for a guest burn of %.2f s over %.1f s running", host, guestBurn, running)
	}
	if g := secs(t, b.GuestCPUSeconds); g < 0.9*guestBurn {
		t.Errorf("the guest reports %.2f busy s, it burned %.2f", g, guestBurn)
	}
	if ih := secs(t, i.ActiveCPUSeconds); ih >= host-0.5*guestBurn {
		t.Errorf("idle sandbox metered %.2f cpu-s, busy one %.2f", ih, host)
	}
	// Each charge follows from its quantities: memory GiB-s at $0.0075/GiB-h,
	// CPU at $0.025/vCPU-h on the greater of what it burned and the floor.
	for name, g := range map[string]usageGroup{"busy": b, "idle": i} {
		mem := new(big.Rat).Mul(rat(t, g.MemoryGiBSeconds), big.NewRat(75, 10000*3600))
		if want := microsOf(mem); g.MemoryMicros != want {
			t.Errorf("%s: memory %s µ$, want %s", name, g.MemoryMicros, want)
		}
		floor := new(big.Rat).Mul(rat(t, g.RunningSeconds), big.NewRat(5, 100))
		billed := rat(t, g.ActiveCPUSeconds)
		if billed.Cmp(floor) < 0 {
			billed = floor
		}
		if rat(t, g.BilledCPUSeconds).Cmp(billed) != 0 {
			t.Errorf("%s: billed cpu %s s, want max(%s, floor %s)", name, g.BilledCPUSeconds, g.ActiveCPUSeconds, floor.FloatString(3))
		}
		if want := microsOf(new(big.Rat).Mul(billed, big.NewRat(25, 1000*3600))); g.CPUMicros != want {
			t.Errorf("%s: cpu %s µ$, want %s", name, g.CPUMicros, want)
		}
	}
	// The sandbox object carries its charge.
	type charged struct {
		ChargedMicros *string `json:"chargedMicros"`
	}
	sb, _ := call[charged](t, c, "GET", "/v1/sandboxes/"+busy.ID, nil, nil)
	if sb.ChargedMicros == nil || *sb.ChargedMicros != b.ChargedMicros {
		t.Errorf("sandbox chargedMicros %v, usage says %s", sb.ChargedMicros, b.ChargedMicros)
	}
}

// burnGuest burns seconds of CPU as the guest counts it.
func burnGuest(t testing.TB, c *client, id string, seconds float64) {
	t.Helper()
	c.sh(t, id, fmt.Sprintf(`python3 -c '
import time
t = time.process_time()
while time.process_time() - t < %g:
    pass'`, seconds))
}

// TestMeteringSurvivesKill9: the server is killed with SIGKILL while a
// sandbox burns CPU, and the next server reattaches it: the usage counts
// every burned second once, and no more running time than really passed.
func TestMeteringSurvivesKill9(t *testing.T) {
	needVMs(t)
	dataDir := t.TempDir()
	s1 := startServerWith(t, dataDir, "--meter-interval", "2s")
	c := s1.client(s1.AdminKey)
	sb := c.createRunning(t, map[string]any{"vcpu": 1, "memoryMiB": 1024})
	ready := time.Now()
	burnGuest(t, c, sb.ID, 3)
	time.Sleep(3 * time.Second) // a sample or two are settled
	burnGuest(t, c, sb.ID, 2)   // and this, in part, after the last one
	s1.kill9(t)

	s2 := startServerWith(t, dataDir, "--meter-interval", "2s")
	c = s2.client(s2.AdminKey)
	waitAgent(t, c, sb.ID)
	burnGuest(t, c, sb.ID, 2)
	c.lifecycle(t, sb.ID, "stop", nil)
	wall := time.Since(ready).Seconds()

	type usage struct {
		Groups []usageGroup `json:"groups"`
	}
	u, _ := call[usage](t, c, "GET", "/v1/usage", nil, nil)
	var g usageGroup
	for _, x := range u.Groups {
		if x.Key == sb.ID {
			g = x
		}
	}
	host, running := secs(t, g.ActiveCPUSeconds), secs(t, g.RunningSeconds)
	t.Logf("running %.2f s of %.2f s wall; host cpu %.2f s for 7 s burned; guest %s s", running, wall, host, g.GuestCPUSeconds)
	// The server starts charging at ready, a moment before the create's
	// answer reaches this test: a second of slack, never more.
	if running > wall+1 || running < wall-10 {
		t.Errorf("running %.2f s, but %.2f s passed from ready to stop", running, wall)
	}
	if host < 0.9*7 || host > 2*running {
		t.Errorf("host cpu %.2f s for 7 CPU-s burned in the guest over %.2f s", host, running)
	}
	if g.Runs != 1 {
		t.Errorf("%d runs counted, want 1: a reattach continues the run", g.Runs)
	}
}
