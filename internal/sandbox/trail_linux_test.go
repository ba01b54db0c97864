package sandbox_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/store"
)

// trailChecker is the store, checking at the moment each transition is
// committed, before the manager goes on, that the event reporting it is
// committed too.
type trailChecker struct {
	*store.Store
	mu     sync.Mutex
	faults []string
}

func (c *trailChecker) InsertSandbox(ctx context.Context, sb *sandbox.Sandbox, key string, entries ...*sandbox.TrailEntry) error {
	if err := c.Store.InsertSandbox(ctx, sb, key, entries...); err != nil {
		return err
	}
	if trail, err := c.Store.ListEvents(ctx, sb.ID, 0); err != nil || !slices.Contains(types(trail), "created") {
		c.mu.Lock()
		c.faults = append(c.faults, fmt.Sprintf("sandbox %s inserted without its created event (%v)", sb.ID, err))
		c.mu.Unlock()
	}
	return nil
}

// reports are the trail types that may report a change into a state.
var reports = map[sandbox.State][]string{
	sandbox.StateRunning: {"ready", "woken", "restored"},
	sandbox.StatePaused:  {"paused"},
	sandbox.StateStopped: {"stopped"},
	sandbox.StateDeleted: {"deleted"},
}

func (c *trailChecker) UpdateSandbox(ctx context.Context, id string, fn func(*sandbox.Sandbox) bool, entries ...*sandbox.TrailEntry) (*sandbox.Sandbox, error) {
	var before sandbox.State
	if sb, err := c.Store.GetSandbox(ctx, id); err == nil {
		before = sb.State
	}
	before0, _ := c.Store.ListEvents(ctx, id, 0)
	sb, err := c.Store.UpdateSandbox(ctx, id, fn, entries...)
	if err != nil || sb.State == before || reports[sb.State] == nil {
		return sb, err
	}
	after, lerr := c.Store.ListEvents(ctx, id, 0)
	if lerr != nil {
		return sb, lerr
	}
	if !slices.ContainsFunc(after[min(len(before0), len(after)):], func(ev store.Event) bool { return slices.Contains(reports[sb.State], ev.Type) }) {
		c.mu.Lock()
		c.faults = append(c.faults, fmt.Sprintf("%s → %s committed without its event (trail: %v)", before, sb.State, types(after)))
		c.mu.Unlock()
	}
	return sb, err
}

func types(trail []store.Event) []string {
	var out []string
	for _, ev := range trail {
		out = append(out, ev.Type)
	}
	return out
}

// TestTransitionsCommitWithTheirEvents: a create's record, its running, a pause, a
// wake, a stop and a delete are each committed with the event that
// reports them (DESIGN D23), so a client woken by the change, or one
// reading the record, finds the event at once.
func TestTransitionsCommitWithTheirEvents(t *testing.T) {
	e := newEnv(t)
	chk := &trailChecker{Store: e.st}
	m := e.managerWith(func(cfg *sandbox.Config) { cfg.Store = chk })
	ctx := context.Background()
	sb := running(t, m, spec())
	pause(t, m, sb.ID)
	wake(t, m, sb.ID)
	if _, err := m.Stop(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateStopped)
	if _, err := m.Delete(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	chk.mu.Lock()
	defer chk.mu.Unlock()
	for _, f := range chk.faults {
		t.Error(f)
	}
	trail, err := e.st.ListEvents(ctx, sb.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"created", "ready", "paused", "woken", "stopped", "deleted"} {
		if !slices.Contains(types(trail), want) {
			t.Errorf("trail %v has no %s", types(trail), want)
		}
	}
}
