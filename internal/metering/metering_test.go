package metering

import (
	"math/big"
	"testing"
	"time"
)

func TestDeltaSplitsAtHours(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 59, 30, 0, time.UTC)
	c := Reading{At: t0, VM: "a", CPUNs: 1e9, GuestCPUNs: 5e8, EgressBytes: 100}
	r := Reading{At: t0.Add(90 * time.Second), VM: "a", CPUNs: 1e9 + 9e9, GuestCPUNs: 5e8 + 3e9, EgressBytes: 190, RSSBytes: 7}
	b := Delta(c, r, Shape{VCPU: 2, MemoryMiB: 4096})
	if len(b) != 2 {
		t.Fatalf("%d buckets, want 2: %+v", len(b), b)
	}
	if b[0].Hour != t0.Truncate(time.Hour) || b[1].Hour != t0.Truncate(time.Hour).Add(time.Hour) {
		t.Errorf("hours %v %v", b[0].Hour, b[1].Hour)
	}
	if b[0].RunningMs != 30000 || b[1].RunningMs != 60000 {
		t.Errorf("running %d + %d ms, want 30000 + 60000", b[0].RunningMs, b[1].RunningMs)
	}
	if b[0].CPUNs != 3e9 || b[1].CPUNs != 6e9 {
		t.Errorf("cpu %d + %d", b[0].CPUNs, b[1].CPUNs)
	}
	if b[0].GuestCPUNs+b[1].GuestCPUNs != 3e9 || b[0].EgressBytes+b[1].EgressBytes != 90 {
		t.Errorf("guest or egress not conserved: %+v", b)
	}
	if b[1].VCPUMs != 120000 || b[1].MemoryMiBMs != 4096*60000 || b[1].RSSMaxBytes != 7 {
		t.Errorf("shape: %+v", b[1])
	}
}

func TestDeltaConservesOddCounts(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 7, 20, 0, 1e6, time.UTC)
	c := Reading{At: t0, CPUNs: 0}
	r := Reading{At: t0.Add(3*time.Hour + 7*time.Millisecond), CPUNs: 1_000_000_007, EgressBytes: 13}
	var running, cpu, eg int64
	for _, b := range Delta(c, r, Shape{VCPU: 1, MemoryMiB: 1}) {
		running += b.RunningMs
		cpu += b.CPUNs
		eg += b.EgressBytes
	}
	if running != r.At.Sub(t0).Milliseconds() || cpu != 1_000_000_007 || eg != 13 {
		t.Errorf("running %d cpu %d egress %d", running, cpu, eg)
	}
}

func TestDeltaHostileAndResets(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 7, 0, 0, 0, time.UTC)
	c := Reading{At: t0, CPUNs: 5e9, GuestCPUNs: 1e9, EgressBytes: 1000}
	// The guest claims a year of CPU in ten seconds; the egress gate was
	// made anew (a restart), so its count starts over.
	r := Reading{At: t0.Add(10 * time.Second), CPUNs: 6e9, GuestCPUNs: 1e9 + int64(365*24*time.Hour), EgressBytes: 40}
	b := Delta(c, r, Shape{VCPU: 2, MemoryMiB: 512})
	if len(b) != 1 {
		t.Fatal(b)
	}
	if want := int64(2 * (10*time.Second + guestSlack)); b[0].GuestCPUNs != want {
		t.Errorf("guest cpu %d, want it capped at %d", b[0].GuestCPUNs, want)
	}
	if b[0].EgressBytes != 40 || b[0].CPUNs != 1e9 {
		t.Errorf("%+v", b[0])
	}
	if got := Delta(r, c, Shape{VCPU: 1}); got != nil {
		t.Errorf("an older reading gave %+v", got)
	}
}

func TestStorage(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 7, 30, 0, 0, time.UTC)
	b := Storage(1<<30, t0, t0.Add(time.Hour))
	if len(b) != 2 || b[0].StorageByteMs != (1<<30)*1800000 || b[1].StorageByteMs != (1<<30)*1800000 {
		t.Errorf("%+v", b)
	}
}

func TestDecimal(t *testing.T) {
	for _, c := range []struct {
		num, den int64
		want     string
	}{
		{90000, 1000, "90"}, {15_000_000_001, 1e9, "15.000000001"}, {4096 * 90000, 1024 * 1000, "360"},
		{3, 1024000, "0.0000029296875"}, {0, 1000, "0"}, {-1500, 1000, "-1.5"},
	} {
		got := Decimal(c.num, c.den)
		r, ok := new(big.Rat).SetString(got)
		if !ok || r.Cmp(big.NewRat(c.num, c.den)) != 0 {
			t.Errorf("Decimal(%d, %d) = %q, not exact", c.num, c.den, got)
		}
		if got != c.want {
			t.Errorf("Decimal(%d, %d) = %q, want %q", c.num, c.den, got, c.want)
		}
	}
}
