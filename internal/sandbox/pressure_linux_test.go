package sandbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// TestMemoryPressure: below the floor, one tick pauses the running sandbox
// idle longest that a call would wake again, never a persistent one nor one
// without autoWake, and one with a call in flight only when no other is
// left; above it, nothing is paused.
func TestMemoryPressure(t *testing.T) {
	e := newEnv(t)
	var avail atomic.Int64
	avail.Store(8192)
	m := e.managerWith(func(c *sandbox.Config) {
		c.MemoryFloorMiB = 1024
		c.MemAvailable = func() (int64, error) { return avail.Load(), nil }
	})
	ctx := context.Background()
	persistent := spec()
	persistent.TimeoutSeconds, persistent.Persistent = 0, true
	noWake := spec()
	noWake.AutoWake = new(bool)
	p := running(t, m, persistent)
	n := running(t, m, noWake)
	old := running(t, m, spec())
	e.clock.Advance(time.Second)
	recent := running(t, m, spec())
	if _, err := exec(ctx, m, "k", recent.ID, agentproto.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	// A call in flight on the one idle longest: it goes last.
	call, end := context.WithCancel(ctx)
	defer end()
	if _, _, err := m.Guest(call, "k", old.ID); err != nil {
		t.Fatal(err)
	}
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 0 {
		t.Fatalf("with memory to spare %v were paused", got)
	}
	avail.Store(512)
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 1 || got[0] != recent.ID {
		t.Fatalf("under pressure %v were paused, want %s (no call in flight) alone", got, recent.ID)
	}
	waitState(t, m, "k", recent.ID, sandbox.StatePaused)
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 1 || got[0] != old.ID {
		t.Fatalf("still under pressure %v were paused, want %s (the last candidate, call in flight or not)", got, old.ID)
	}
	waitState(t, m, "k", old.ID, sandbox.StatePaused)
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 0 {
		t.Fatalf("%v were paused: only persistent sandboxes and ones without autoWake are left", got)
	}
	for _, id := range []string{p.ID, n.ID} {
		if sb, _ := m.Get(ctx, "k", id); sb.State != sandbox.StateRunning {
			t.Errorf("%s is %s, want running", id, sb.State)
		}
	}
}
