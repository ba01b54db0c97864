package sandbox_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/metering"
	"github.com/emberbox/emberbox/internal/pricing"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/vmm/vmmtest"
)

// waitMeter waits until sandbox id's metering interval is open (its
// watcher opens it once it runs) and returns that interval's start.
func waitMeter(t *testing.T, e *env, id string) *metering.Reading {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := e.st.OpenMeter(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if r != nil {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("the meter of %s never opened", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func usageOf(t *testing.T, e *env, q metering.Query) pricing.Usage {
	t.Helper()
	rows, err := e.st.UsageRows(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	return metering.Summarize(rows, pricing.DefaultRates()).Usage
}

// TestMeterStopBetweenSamples: usage read at a sample and at a stop that
// comes between samples adds up exactly, with boot CPU left out, and the
// pause and wake that follow a run count as a second run.
func TestMeterStopBetweenSamples(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m := e.manager()
	sb, err := m.Create(ctx, "k", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	if start := waitMeter(t, e, sb.ID); start.CPUNs != int64(vmmtest.BootCPU) {
		t.Errorf("interval opens at %v of CPU, want the boot's %v (not charged)", time.Duration(start.CPUNs), vmmtest.BootCPU)
	}
	mach := e.drv.Machine(sb.ID)
	mach.AddCPU(3 * time.Second)
	e.clock.Advance(10 * time.Second)
	m.Meter.SettleAll(ctx)

	mach.AddCPU(2 * time.Second)
	e.clock.Advance(5 * time.Second)
	if _, err := m.Pause(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StatePaused)
	got := usageOf(t, e, metering.Query{Owner: "k"})
	if got.RunningMs != 15000 || got.ActiveCPUNs != int64(5*time.Second) || got.Runs != 1 || got.MemoryMiBMs != 4096*15000 {
		t.Errorf("after pause: %+v; want 15 s running, 5 s of CPU, one run", got)
	}
	// Paused, it is charged for no time, only for its kept disk.
	e.clock.Advance(time.Hour)
	m.Meter.SettleAll(ctx)
	if after := usageOf(t, e, metering.Query{Owner: "k"}); after.RunningMs != 15000 {
		t.Errorf("a paused sandbox ran %d ms", after.RunningMs)
	}

	if _, err := m.Wake(ctx, "k", sb.ID, nil); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	waitMeter(t, e, sb.ID)
	e.drv.Machine(sb.ID).AddCPU(time.Second)
	e.clock.Advance(4 * time.Second)
	if _, err := m.Stop(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateStopped)
	got = usageOf(t, e, metering.Query{Owner: "k"})
	if got.RunningMs != 19000 || got.ActiveCPUNs != int64(6*time.Second) || got.Runs != 2 {
		t.Errorf("after wake and stop: %+v; want 19 s running, 6 s of CPU, two runs", got)
	}
	if r, _ := e.st.OpenMeter(ctx, sb.ID); r != nil {
		t.Errorf("a stopped sandbox's interval is still open: %+v", r)
	}
	if other := usageOf(t, e, metering.Query{Owner: "other"}); other != (pricing.Usage{}) {
		t.Errorf("another key sees %+v", other)
	}
}

// TestMeterRestartCountsNothingTwice: a server that goes away and a new
// one that reattaches the running VM charge each CPU-second once.
func TestMeterRestartCountsNothingTwice(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m1 := e.manager()
	sb, _ := m1.Create(ctx, "k", spec())
	waitState(t, m1, "k", sb.ID, sandbox.StateRunning)
	waitMeter(t, e, sb.ID)
	mach := e.drv.Machine(sb.ID)
	mach.AddCPU(time.Second)
	e.clock.Advance(10 * time.Second)
	m1.Meter.SettleAll(ctx)
	mach.AddCPU(500 * time.Millisecond) // used while no server watched
	e.clock.Advance(3 * time.Second)
	m1.Close()

	m2 := e.manager()
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	waitState(t, m2, "k", sb.ID, sandbox.StateRunning)
	waitMeter(t, e, sb.ID)
	mach.AddCPU(2 * time.Second)
	e.clock.Advance(7 * time.Second)
	m2.Meter.SettleAll(ctx)
	m2.Meter.SettleAll(ctx) // a second reading at the same instant adds nothing
	got := usageOf(t, e, metering.Query{Owner: "k"})
	if got.RunningMs != 20000 || got.ActiveCPUNs != int64(3500*time.Millisecond) || got.Runs != 1 {
		t.Errorf("usage %+v; want 20 s running, 3.5 s of CPU, one run", got)
	}
}

// TestMeterKeptDisk: a stopped sandbox's disk is charged by the hour it is
// kept, up to its deletion even between periodic charges.
func TestMeterKeptDisk(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m := e.manager()
	sb, _ := m.Create(ctx, "k", spec())
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	if _, err := m.Stop(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateStopped)
	// The fake VM writes no disk: give it 4 MiB of allocated blocks.
	if err := os.WriteFile(filepath.Join(e.dir, "sandboxes", sb.ID, "disk.img"), make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour)
	m.Meter.SettleAll(ctx)
	hour := int64(time.Hour / time.Millisecond)
	if got := usageOf(t, e, metering.Query{Owner: "k"}).StorageMiBMs; got < 4*hour || got > 5*hour {
		t.Errorf("after an hour kept: %d MiB-ms, want about %d", got, 4*hour)
	}
	e.clock.Advance(30 * time.Minute)
	if _, err := m.Delete(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := usageOf(t, e, metering.Query{Owner: "k"}).StorageMiBMs; got < 6*hour || got > 7*hour+hour/2 {
		t.Errorf("after 1.5 h kept and a delete: %d MiB-ms, want about %d", got, 6*hour)
	}
}

// TestPortTrafficKeepsSandboxAwake: bytes flowing over a port connection
// (a tunnel's, a preview's) are activity, so an idle pause waits for them
// to stop, not only for the connection to open.
func TestPortTrafficKeepsSandboxAwake(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m := e.manager()
	sp := spec()
	sp.TimeoutSeconds, sp.IdlePauseSeconds = 0, 60
	sb, err := m.Create(ctx, "k", sp)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = io.Copy(c, c) // echo
			c.Close()
		}
	}()
	_, g, err := m.Guest(ctx, "k", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := g.DialPort(ctx, ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	e.clock.Advance(50 * time.Second)
	buf := make([]byte, 1)
	if _, err := conn.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(conn, buf); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(50 * time.Second) // 100 s since the open, 50 s since the traffic
	m.Reaper.ExpireLeases(ctx)
	if got, _ := m.Get(ctx, "k", sb.ID); got.State != sandbox.StateRunning {
		t.Fatalf("paused while its port carried traffic 50 s ago: %s", got.State)
	}
	e.clock.Advance(11 * time.Second) // 61 s without traffic
	m.Reaper.ExpireLeases(ctx)
	if got, _ := m.Get(ctx, "k", sb.ID); got.State != sandbox.StatePausing && got.State != sandbox.StatePaused {
		t.Errorf("still %s after 61 s without traffic, want pausing", got.State)
	}
}

// TestMeterFeedsMeasuredAdmission: each reading of a running VM charges
// it in a measured ledger by its resident memory, so what the ledger
// expects of it falls from the start estimate to the headroom; paused, it
// is expected to take nothing.
func TestMeterFeedsMeasuredAdmission(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ledger := admission.New(admission.Config{VMOverheadMiB: 512,
		Measured: &admission.MeasuredConfig{StartMiB: 512, HeadroomMiB: 64}})
	m := e.managerWith(func(cfg *sandbox.Config) { cfg.Admission = ledger })
	sb, err := m.Create(ctx, "k", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	waitMeter(t, e, sb.ID)
	if got := ledger.Expected(); got != 512 {
		t.Errorf("before a reading with memory: expected %d MiB, want the start estimate 512", got)
	}
	e.drv.Machine(sb.ID).SetRSS(300 << 20)
	m.Meter.SettleAll(ctx)
	if got := ledger.Expected(); got != 64 {
		t.Errorf("after a reading of 300 MiB: expected %d MiB, want the headroom 64", got)
	}
	if _, err := m.Pause(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StatePaused)
	if got := ledger.Expected(); got != 0 {
		t.Errorf("paused: expected %d MiB, want 0", got)
	}
}

// TestOutOfMemoryEvent: a rise in the guest's count of OOM kills since
// its baseline (the first reading) is recorded as an out_of_memory event
// naming how many processes its kernel ended; no rise, no event.
func TestOutOfMemoryEvent(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m := e.manager()
	sb, err := m.Create(ctx, "k", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	waitMeter(t, e, sb.ID) // the first reading, the baseline, is taken
	oom := func() []map[string]any {
		evs, err := e.st.ListEvents(ctx, sb.ID, 100)
		if err != nil {
			t.Fatal(err)
		}
		var out []map[string]any
		for _, ev := range evs {
			if ev.Type == "out_of_memory" {
				out = append(out, ev.Data)
			}
		}
		return out
	}
	// The fake guest's baseline is the host's own count; start above it.
	for _, total := range []int64{1 << 30, 1<<30 + 2, 1<<30 + 2} {
		if !sandbox.ReportGuestOOMKills(m, sb.ID, total) {
			t.Fatal("no live instance")
		}
	}
	evs := oom()
	if len(evs) != 2 {
		t.Fatalf("out_of_memory events %v, want two (the jump from the baseline, then 2 more kills)", evs)
	}
	if k, _ := evs[1]["kills"].(float64); k != 2 {
		t.Errorf("second event %v, want kills 2", evs[1])
	}
	if mem, _ := evs[1]["memoryMiB"].(float64); mem != 4096 {
		t.Errorf("event %v does not name the sandbox's memory", evs[1])
	}
}
