package pricing

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// smolagents is the product page's workload: 40,000 runs a month, 90 s
// each on 2 vCPU / 4 GiB, busy for 15 CPU-seconds.
func smolagents(t *testing.T) Usage {
	t.Helper()
	u, err := DefaultRates().Workload(40_000, 90*time.Second, 2, 4<<10, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestWorkload(t *testing.T) {
	got := smolagents(t)
	want := Usage{
		RunningMs:   3_600_000_000,
		VCPUMs:      7_200_000_000,
		MemoryMiBMs: 3_600_000_000 * 4096,
		ActiveCPUNs: 600_000 * 1e9,
		BilledCPUNs: 600_000 * 1e9, // 15 s busy is above the 4.5 s floor
		Runs:        40_000,
	}
	if got != want {
		t.Errorf("Workload:\n got %+v\nwant %+v", got, want)
	}
	// An idle run is billed at the floor: 0.05 vCPU × 90 s = 4.5 s.
	idle, err := DefaultRates().Workload(1, 90*time.Second, 2, 4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	if idle.BilledCPUNs != 4_500_000_000 || idle.ActiveCPUNs != 0 {
		t.Errorf("idle run: billed %d ns, active %d ns", idle.BilledCPUNs, idle.ActiveCPUNs)
	}
	for _, bad := range []struct {
		runs, vcpu, mib int64
		run, busy       time.Duration
	}{
		{-1, 2, 4096, time.Second, 0},
		{1, -2, 4096, time.Second, 0},
		{1, 2, -1, time.Second, 0},
		{1, 2, 4096, -time.Second, 0},
		{1, 2, 4096, time.Second, -1},
		{1 << 40, 1 << 20, 4096, time.Hour, 0}, // overflows
	} {
		if _, err := DefaultRates().Workload(bad.runs, bad.run, bad.vcpu, bad.mib, bad.busy); err == nil {
			t.Errorf("Workload(%+v) accepted", bad)
		}
	}
}

// TestProductPage reproduces the product page's table: the exact
// microdollars and the cents the page shows.
func TestProductPage(t *testing.T) {
	u := smolagents(t)
	for _, tc := range []struct {
		id     string
		micros int64
		cents  int64
	}{
		{"runtime", 34_166_667, 3417}, // CPU $4.1666…, memory $30
		{"e2b", 165_600_000, 16560},
		{"modal", 237_960_000, 23796},
		{"blaxel", 193_200_000, 19320},            // 105 s per run with the standby tail
		{"blaxel-no-standby", 165_600_000, 16560}, // 90 s per run
	} {
		p, ok := LookupProvider(tc.id)
		if !ok {
			t.Fatalf("no provider %q", tc.id)
		}
		q := p.Price(u)
		if q.TotalMicros != tc.micros || Cents(q.TotalMicros) != tc.cents {
			t.Errorf("%s: %d µ$ (%d cents), want %d µ$ (%d cents)", tc.id, q.TotalMicros, Cents(q.TotalMicros), tc.micros, tc.cents)
		}
	}
	// Emberbox's own charge is Runtime's quote.
	c := DefaultRates().Charge(u)
	want := Charge{CPUMicros: 4_166_667, MemoryMicros: 30_000_000, TotalMicros: 34_166_667}
	if c != want {
		t.Errorf("Charge = %+v, want %+v", c, want)
	}
}

// TestDocsExample is Runtime's docs' standard example: 1,000 runs × 60 s,
// 20 CPU-s each, 2 vCPU / 4 GiB = $0.64 (CPU $0.1389 + memory $0.50).
func TestDocsExample(t *testing.T) {
	r := DefaultRates()
	u, err := r.Workload(1000, time.Minute, 2, 4096, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := r.Charge(u)
	if c.CPUMicros != 138_889 || c.MemoryMicros != 500_000 || c.TotalMicros != 638_889 || Cents(c.TotalMicros) != 64 {
		t.Errorf("Charge = %+v, want CPU 138889, memory 500000, total 638889 ($0.64)", c)
	}
}

// TestFloor: a 2 vCPU / 4 GiB sandbox waiting an hour pays memory and the
// floor, $0.03 + 0.05 × $0.025 = $0.03125.
func TestFloor(t *testing.T) {
	r := DefaultRates()
	hour := int64(time.Hour / time.Millisecond)
	idle := Usage{RunningMs: hour, VCPUMs: 2 * hour, MemoryMiBMs: 4096 * hour}
	if c := r.Charge(idle); c.CPUMicros != 1250 || c.MemoryMicros != 30_000 || c.TotalMicros != 31_250 {
		t.Errorf("idle hour: %+v, want CPU 1250, memory 30000, total 31250", c)
	}
	// The floor is per interval: a busy half hour does not pay for an idle one.
	half := hour / 2
	busy := r.BilledCPUNs(int64(time.Hour), half) // 2 vCPU busy for 30 min
	quiet := r.BilledCPUNs(0, half)
	if busy != int64(time.Hour) || quiet != int64(90*time.Second) {
		t.Errorf("BilledCPUNs: busy %d, quiet %d", busy, quiet)
	}
	u := Usage{RunningMs: hour, MemoryMiBMs: 4096 * hour, ActiveCPUNs: int64(time.Hour), BilledCPUNs: busy + quiet}
	if c := r.Charge(u); c.CPUMicros != 25_625 {
		t.Errorf("CPU of a busy and an idle half hour: %d µ$, want 25625", c.CPUMicros)
	}
}

func TestChargeRounding(t *testing.T) {
	r := DefaultRates()
	// 245,760 MiB-ms is 1/15,000 GiB-h: exactly half a microdollar, which
	// rounds up.
	if c := r.Charge(Usage{MemoryMiBMs: 245_760, BilledCPUNs: 1}); c.MemoryMicros != 1 {
		t.Errorf("half a microdollar of memory: %d", c.MemoryMicros)
	}
	// 0.4 µ$ of CPU and 0.4 µ$ of memory: each part rounds to 0, the
	// total of 0.8 µ$ to 1.
	c := r.Charge(Usage{BilledCPUNs: 57_600_000, MemoryMiBMs: 196_608})
	if c.CPUMicros != 0 || c.MemoryMicros != 0 || c.TotalMicros != 1 {
		t.Errorf("Charge = %+v, want parts 0 and total 1", c)
	}
	// A 4 GiB disk kept 30 days is 4.294967296 GB × $0.08; a GiB of
	// snapshot for an hour is 119 µ$.
	month := int64(30 * 24 * time.Hour / time.Millisecond)
	c = r.Charge(Usage{StorageMiBMs: 4096 * month, SnapshotMiBMs: 1024 * int64(time.Hour/time.Millisecond), BilledCPUNs: 1})
	if c.StorageMicros != 343_597 || c.SnapshotMicros != 119 || c.TotalMicros != 343_716 {
		t.Errorf("storage: %+v", c)
	}
	for _, tc := range []struct{ micros, cents int64 }{
		{34_166_667, 3417}, {5_000, 1}, {4_999, 0}, {-5_000, -1}, {-4_999, 0}, {0, 0},
	} {
		if got := Cents(tc.micros); got != tc.cents {
			t.Errorf("Cents(%d) = %d, want %d", tc.micros, got, tc.cents)
		}
	}
}

func TestEgress(t *testing.T) {
	r := DefaultRates()
	if got := r.EgressMicros(100 << 30); got != 0 {
		t.Errorf("the allowance: %d µ$", got)
	}
	if got := r.EgressMicros(100<<30 + 1e9); got != 20_000 {
		t.Errorf("1 GB past the allowance: %d µ$, want 20000", got)
	}
	if got := r.EgressMicros(0); got != 0 {
		t.Errorf("none: %d µ$", got)
	}
}

func TestValidate(t *testing.T) {
	if err := DefaultRates().Validate(); err != nil {
		t.Fatalf("default rates: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Rates)
		want string
	}{
		{func(r *Rates) { r.CPUPerVCPUHour = "-0.01" }, `CPU rate (per vCPU-hour): "-0.01" is negative`},
		{func(r *Rates) { r.MemoryPerGiBHour = "" }, "memory rate (per GiB-hour): empty"},
		{func(r *Rates) { r.CPUFloorVCPU = "1/20" }, `CPU floor (vCPU): "1/20" is not a decimal number`},
		{func(r *Rates) { r.StoragePerGBMonth = "8e-2" }, "storage rate"},
		{func(r *Rates) { r.SnapshotPerGiBHour = "." }, "snapshot rate"},
		{func(r *Rates) { r.EgressPerGB = "0.02." }, "egress rate"},
		{func(r *Rates) { r.EgressFreeBytes = -1 }, "egress allowance: -1 bytes is negative"},
	} {
		r := DefaultRates()
		tc.edit(&r)
		err := r.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want it to say %q", err, tc.want)
		}
	}
	// Every bad field is reported, not just the first.
	r := DefaultRates()
	r.CPUPerVCPUHour, r.EgressPerGB = "x", "y"
	if err := r.Validate(); err == nil || !strings.Contains(err.Error(), "CPU rate") || !strings.Contains(err.Error(), "egress rate") {
		t.Errorf("two bad rates: %v", err)
	}
	// Exact decimals: 0.1 + 0.2 is 0.3 here.
	r = DefaultRates()
	r.MemoryPerGiBHour = "0.3"
	hour := int64(time.Hour / time.Millisecond)
	if c := r.Charge(Usage{MemoryMiBMs: 1024 * hour, BilledCPUNs: 1}); c.MemoryMicros != 300_000 {
		t.Errorf("0.3 per GiB-hour: %d µ$", c.MemoryMicros)
	}
}

func TestProviders(t *testing.T) {
	u := smolagents(t)
	date := regexp.MustCompile(`^20\d\d-[01]\d-[0-3]\d$`)
	seen := map[string]bool{}
	ps := Providers()
	for _, id := range []string{"runtime", "e2b", "modal", "blaxel", "blaxel-no-standby", "daytona", "vercel", "fly"} {
		if _, ok := LookupProvider(id); !ok {
			t.Errorf("no provider %q", id)
		}
	}
	for _, p := range ps {
		if seen[p.ID] {
			t.Errorf("provider %q twice", p.ID)
		}
		seen[p.ID] = true
		if p.Name == "" || p.Model == "" || !strings.HasPrefix(p.Source, "https://") || !date.MatchString(p.ReadOn) || len(p.Rates) == 0 {
			t.Errorf("%s: incomplete: %+v", p.ID, p)
		}
		for _, r := range p.Rates {
			if _, err := parseDecimal(r.Price); err != nil || r.What == "" || r.Unit == "" {
				t.Errorf("%s: rate %+v: %v", p.ID, r, err)
			}
		}
		q := p.Price(u)
		if q.TotalMicros <= 0 || q.CPUMicros < 0 || q.MemoryMicros < 0 || q.OtherMicros < 0 {
			t.Errorf("%s: quote %+v", p.ID, q)
		}
		if d := q.TotalMicros - q.CPUMicros - q.MemoryMicros - q.OtherMicros; d < -2 || d > 2 {
			t.Errorf("%s: parts and total differ by %d µ$", p.ID, d)
		}
		if p.Price(Usage{}).TotalMicros != 0 {
			t.Errorf("%s: no usage costs something", p.ID)
		}
	}
	if ps[0].ID != "runtime" {
		t.Errorf("first provider %q, want runtime", ps[0].ID)
	}
	// The result is the caller's.
	ps[0].Rates[0].Price = "999"
	if p, _ := LookupProvider("runtime"); p.Rates[0].Price == "999" {
		t.Error("Providers shares its rates with callers")
	}
	// Figures that follow from the published rates.
	for _, tc := range []struct {
		id    string
		cents int64
	}{
		{"daytona", 16560}, // the same rates as E2B
		{"vercel", 10616},  // CPU $21.33 + memory $84.80 + 40,000 creations $0.024
		{"fly", 3528},      // shared-cpu-2x with 3.5 GB extra: $0.000009799/s × 3.6 M s
	} {
		p, _ := LookupProvider(tc.id)
		if got := Cents(p.Price(u).TotalMicros); got != tc.cents {
			t.Errorf("%s: %d cents, want %d", tc.id, got, tc.cents)
		}
	}
}
