package store

import (
	"context"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/metering"
	"github.com/emberbox/emberbox/internal/pricing"
)

func sumUsage(t *testing.T, s *Store, q metering.Query) pricing.Usage {
	t.Helper()
	rows, err := s.UsageRows(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	return metering.Summarize(rows, pricing.DefaultRates()).Usage
}

// TestMeterNeverCountsTwice plays a sandbox whose server settles, is
// killed, reopens the database and settles the same VM's counters again.
func TestMeterNeverCountsTwice(t *testing.T) {
	ctx := context.Background()
	s, path := openTest(t)
	shape := metering.Shape{VCPU: 2, MemoryMiB: 1024}
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	at := func(sec int, cpu int64) metering.Reading {
		return metering.Reading{At: t0.Add(time.Duration(sec) * time.Second), VM: "vm1", CPUNs: cpu, EgressBytes: int64(sec)}
	}
	if err := s.BeginMeter(ctx, "sbx_a", "key_a", at(0, 4e9)); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.SettleMeter(ctx, "sbx_a", "key_a", shape, at(15, 5e9), false); !ok || err != nil {
		t.Fatalf("settle: %v %v", ok, err)
	}
	s.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The restarted server reattaches the same VM: Begin keeps the open
	// interval (one run), and the next settle charges from 15 s only.
	if err := s.BeginMeter(ctx, "sbx_a", "key_a", at(20, 5.5e9)); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.SettleMeter(ctx, "sbx_a", "key_a", shape, at(30, 7e9), false); !ok || err != nil {
		t.Fatalf("settle after restart: %v %v", ok, err)
	}
	// The VM ends: its final counters close the interval; a second final
	// settle (a stop racing the watcher) changes nothing.
	if ok, err := s.SettleMeter(ctx, "sbx_a", "key_a", shape, at(31, 7.25e9), true); !ok || err != nil {
		t.Fatalf("final: %v %v", ok, err)
	}
	if ok, _ := s.SettleMeter(ctx, "sbx_a", "key_a", shape, at(40, 9e9), true); ok {
		t.Error("a second final settle charged something")
	}
	got := sumUsage(t, s, metering.Query{Owner: "key_a"})
	if got.RunningMs != 31000 || got.ActiveCPUNs != 3.25e9 || got.Runs != 1 || got.MemoryMiBMs != 1024*31000 || got.EgressBytes != 31 {
		t.Errorf("usage %+v; want 31 s running, 3.25 s cpu, one run", got)
	}
	if other := sumUsage(t, s, metering.Query{Owner: "key_b"}); other != (pricing.Usage{}) {
		t.Errorf("another key sees %+v", other)
	}
	// A new VM of the same sandbox (a restart) is a new run.
	r2 := metering.Reading{At: t0.Add(time.Minute), VM: "vm2", CPUNs: 1e9}
	if err := s.BeginMeter(ctx, "sbx_a", "key_a", r2); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.SettleMeter(ctx, "sbx_a", "key_a", shape, at(70, 1e10), false); ok {
		t.Error("a reading of the old VM settled the new VM's interval")
	}
	if got := sumUsage(t, s, metering.Query{}); got.Runs != 2 {
		t.Errorf("runs %d, want 2", got.Runs)
	}
	pts, err := s.MeterPoints(ctx, "sbx_a", t0, t0.Add(time.Hour))
	if err != nil || len(pts) != 3 {
		t.Fatalf("points %v, %v; want 3", pts, err)
	}
	if pts[0].CPUNs != 1e9 || pts[0].Span != 15*time.Second {
		t.Errorf("first point %+v", pts[0])
	}
}

func TestAccrueStorage(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	t0 := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	for _, now := range []time.Time{t0.Add(10 * time.Minute), t0.Add(40 * time.Minute), t0.Add(40 * time.Minute)} {
		if err := s.AccrueStorage(ctx, "snap_1", metering.KindSnapshot, "key_a", 1<<20, t0, now); err != nil {
			t.Fatal(err)
		}
	}
	got := sumUsage(t, s, metering.Query{ResourceIDs: []string{"snap_1"}})
	if want := int64(40 * time.Minute / time.Millisecond); got.SnapshotMiBMs != want {
		t.Errorf("snapshot storage %d MiB-ms, want %d", got.SnapshotMiBMs, want)
	}
	rows, _ := s.UsageRows(ctx, metering.Query{})
	if len(rows) != 2 || rows[0].Kind != metering.KindSnapshot {
		t.Errorf("rows %+v; want two hours of a snapshot", rows)
	}
}

// BenchmarkSettleMeter measures one settle of a running sandbox's meter:
// what each sandbox costs the store every meter interval.
func BenchmarkSettleMeter(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, b.TempDir()+"/bench.db")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	if err := s.BeginMeter(ctx, "sbx_b", "key_b", metering.Reading{At: t0, VM: "vm"}); err != nil {
		b.Fatal(err)
	}
	shape := metering.Shape{VCPU: 2, MemoryMiB: 4096}
	b.ResetTimer()
	for i := range b.N {
		r := metering.Reading{At: t0.Add(time.Duration(i+1) * 15 * time.Second), VM: "vm", CPUNs: int64(i+1) * 1e9, RSSBytes: 1 << 28}
		if ok, err := s.SettleMeter(ctx, "sbx_b", "key_b", shape, r, false); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}
