package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// TestDiskPressure: a tick pauses every running sandbox whose files grew
// since the previous tick, when the data dir's free space less twice that
// growth is below the floor: a persistent one with a call in flight too,
// as a full disk would end its VM. It pauses none that did not grow, and
// none while the space suffices.
func TestDiskPressure(t *testing.T) {
	e := newEnv(t)
	var free atomic.Int64
	free.Store(100 << 10)
	m := e.managerWith(func(c *sandbox.Config) {
		c.DiskFloorMiB = 2048
		c.DiskFree = func() (int64, error) { return free.Load(), nil }
	})
	ctx := context.Background()
	persistent := spec()
	persistent.TimeoutSeconds, persistent.Persistent = 0, true
	p := running(t, m, persistent)
	a := running(t, m, spec())
	still := running(t, m, spec())
	call, end := context.WithCancel(ctx)
	defer end()
	if _, _, err := m.Guest(call, "k", p.ID); err != nil {
		t.Fatal(err)
	}
	n := 0
	grow := func(ids ...string) {
		for _, id := range ids {
			n++
			name := filepath.Join(e.dir, "sandboxes", id, "grown-"+string(rune('a'+n)))
			if err := os.WriteFile(name, make([]byte, 8<<20), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	tick := func() []string {
		got := m.Reaper.ExpireLeases(ctx)
		slices.Sort(got)
		return got
	}
	if got := tick(); len(got) != 0 {
		t.Fatalf("the first tick, which only measures, paused %v", got)
	}
	grow(p.ID, a.ID)
	if got := tick(); len(got) != 0 {
		t.Fatalf("with space to spare, growing sandboxes %v were paused", got)
	}
	free.Store(1024)
	if got := tick(); len(got) != 0 {
		t.Fatalf("below the floor with nothing growing, %v were paused", got)
	}
	// 16 MiB grew; twice that from 2070 MiB free is below 2048.
	free.Store(2070)
	grow(p.ID, a.ID)
	want := []string{p.ID, a.ID}
	slices.Sort(want)
	if got := tick(); !slices.Equal(got, want) {
		t.Fatalf("under disk pressure %v were paused, want the two that grew, %v", got, want)
	}
	for _, id := range want {
		waitState(t, m, "k", id, sandbox.StatePaused)
		// The paused event follows the paused record.
		reason := ""
		for deadline := time.Now().Add(10 * time.Second); reason == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			evs, err := e.st.ListEvents(ctx, id, 100)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				if ev.Type == "paused" {
					reason, _ = ev.Data["reason"].(string)
				}
			}
		}
		if reason != sandbox.PauseDiskPressure {
			t.Errorf("%s paused for %q, want %q", id, reason, sandbox.PauseDiskPressure)
		}
	}
	if sb, _ := m.Get(ctx, "k", still.ID); sb.State != sandbox.StateRunning {
		t.Errorf("%s, which did not grow, is %s, want running", still.ID, sb.State)
	}
}
