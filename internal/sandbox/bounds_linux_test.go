package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// A tenant cannot pass the operator's egress ceiling: a wider policy is
// reported and enforced as its intersection with the ceiling.
func TestEgressCeiling(t *testing.T) {
	e := newEnv(t)
	op := egress.NewOperator(egress.Operator{Max: egress.MustCompile(egress.Policy{Internet: true, Allow: []string{"pypi.org", "*.pythonhosted.org"}})})
	m := sandbox.New(sandbox.Config{Store: e.st, Driver: e.drv, DataDir: e.dir, BootTimeout: 2 * time.Second, Now: e.clock.Now,
		Egress: op, EgressDefault: egress.Policy{Internet: true}})
	t.Cleanup(m.Close)
	ctx := context.Background()
	sb, err := m.Create(ctx, "key_a", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "key_a", sb.ID, sandbox.StateRunning)
	st, err := m.Networks.Network(ctx, "key_a", sb.ID)
	if err != nil || !st.Limited || !slices.Equal(st.Network.Policy.Allow, []string{"pypi.org", "*.pythonhosted.org"}) {
		t.Errorf("default policy under the ceiling: %+v, %v", st, err)
	}
	st, err = m.Networks.SetNetwork(ctx, "key_a", sb.ID, egress.Policy{Internet: true, Allow: []string{"evil.com", "files.pythonhosted.org", "0.0.0.0/0"}})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Limited || !st.Network.Policy.Internet || !slices.Equal(st.Network.Policy.Allow, []string{"files.pythonhosted.org"}) || !st.Enforced {
		t.Errorf("wider policy: %+v, want only files.pythonhosted.org, enforced", st)
	}
	// Narrower than the ceiling: as asked.
	st, err = m.Networks.SetNetwork(ctx, "key_a", sb.ID, egress.Policy{Internet: true, Allow: []string{"pypi.org"}})
	if err != nil || st.Limited || !slices.Equal(st.Network.Policy.Allow, []string{"pypi.org"}) {
		t.Errorf("narrower policy: %+v, %v", st, err)
	}
}

// A stopped sandbox's files are removed after the retention; the record
// stays, and the kept disks are counted until then.
func TestStoppedDiskRetention(t *testing.T) {
	e := newEnv(t)
	m := sandbox.New(sandbox.Config{Store: e.st, Driver: e.drv, DataDir: e.dir, BootTimeout: 2 * time.Second, Now: e.clock.Now,
		StoppedDiskRetention: time.Hour})
	t.Cleanup(m.Close)
	ctx := context.Background()
	sb, err := m.Create(ctx, "key_a", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "key_a", sb.ID, sandbox.StateRunning)
	if _, err := m.Stop(ctx, "key_a", sb.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "key_a", sb.ID, sandbox.StateStopped)
	dir := filepath.Join(e.dir, "sandboxes", sb.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil { // the fake driver may keep nothing there
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "disk.qcow2"), []byte("disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, mib, err := m.Reaper.KeptDisks(ctx, "key_a"); err != nil || n != 1 || mib != 4096 {
		t.Errorf("KeptDisks = %d, %d, %v; want 1, 4096", n, mib, err)
	}
	if got := m.Reaper.RemoveStoppedDisks(ctx); len(got) != 0 {
		t.Errorf("removed %v before the retention", got)
	}
	e.clock.Advance(time.Hour + time.Second)
	if got := m.Reaper.RemoveStoppedDisks(ctx); !slices.Equal(got, []string{sb.ID}) {
		t.Errorf("removed %v, want %s", got, sb.ID)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("files still there: %v", err)
	}
	if got, err := m.Get(ctx, "key_a", sb.ID); err != nil || got.State != sandbox.StateStopped {
		t.Errorf("record after removal: %+v, %v", got, err)
	}
	if n, _, _ := m.Reaper.KeptDisks(ctx, "key_a"); n != 0 {
		t.Errorf("KeptDisks = %d after removal", n)
	}
	if got := m.Reaper.RemoveStoppedDisks(ctx); len(got) != 0 {
		t.Errorf("removed %v twice", got)
	}
	evs, _ := e.st.ListEvents(ctx, sb.ID, 0)
	if len(evs) == 0 || evs[len(evs)-1].Type != "disk_removed" {
		t.Errorf("no disk_removed event: %+v", evs)
	}
	// Deleting it later still works.
	if _, err := m.Delete(ctx, "key_a", sb.ID); err != nil {
		t.Errorf("delete after removal: %v", err)
	}
}
