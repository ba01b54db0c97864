package sandbox_test

import (
	"context"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/store"
	"github.com/emberbox/emberbox/internal/vmm/vmmtest"
	"github.com/emberbox/emberbox/internal/webhook"
	"go.uber.org/goleak"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type env struct {
	t     *testing.T
	st    *store.Store
	drv   *vmmtest.Driver
	clock *fakeClock
	dir   string
}

// newEnv sets up a store and a fake driver. When the test ends, its
// managers are closed and its VMs stopped, and then no goroutine may be
// left that was not running before the test began: a manager owns every
// goroutine it starts.
func newEnv(t *testing.T) *env {
	t.Helper()
	var before goleak.Option
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // runs last
	drv := vmmtest.NewDriver(t)                        // its cleanup stops every VM
	before = goleak.IgnoreCurrent()
	dir := t.TempDir()
	st, err := store.Open(context.Background(), dir+"/test.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &env{t: t, st: st, drv: drv, clock: &fakeClock{now: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}, dir: dir}
}

// manager returns a manager of the env, closed when the test ends.
func (e *env) manager() *sandbox.Manager { return e.managerWith(func(*sandbox.Config) {}) }

func spec() sandbox.CreateSpec {
	return sandbox.CreateSpec{VCPU: 2, MemoryMiB: 4096, DiskMiB: 4096, TimeoutSeconds: 60, OnLeaseEnd: sandbox.LeaseEndStop,
		Env: map[string]string{"GREETING": "hello"}}
}

func waitState(t *testing.T, m *sandbox.Manager, owner, id string, want sandbox.State) *sandbox.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sb, err := m.WaitFor(ctx, owner, id, want)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != want {
		t.Fatalf("sandbox %s is %s (reason %q), want %s", id, sb.State, sb.StopReason, want)
	}
	return sb
}

func TestCreateExecAndEnv(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	sb, err := m.Create(ctx, "key_a", spec())
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != sandbox.StateStarting || len(sb.EnvNames) != 1 || sb.EnvNames[0] != "GREETING" {
		t.Errorf("created %+v", sb)
	}
	sb = waitState(t, m, "key_a", sb.ID, sandbox.StateRunning)
	if sb.ReadyAt == nil || sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(sb.ReadyAt.Add(60*time.Second)) {
		t.Errorf("readyAt %v expiresAt %v, want the lease to start at ready", sb.ReadyAt, sb.ExpiresAt)
	}
	res, err := exec(ctx, m, "key_a", sb.ID, agentproto.ExecRequest{Command: `echo "$GREETING"`})
	if err != nil || string(res.Stdout) != "hello\n" {
		t.Errorf("exec with sandbox env: %q, %v", res.Stdout, err)
	}
	// Another key sees nothing.
	if _, err := m.Get(ctx, "key_b", sb.ID); !errdefs.IsNotFound(err) {
		t.Errorf("other owner Get: %v, want not found", err)
	}
	if _, err := exec(ctx, m, "key_b", sb.ID, agentproto.ExecRequest{Command: "true"}); !errdefs.IsNotFound(err) {
		t.Errorf("other owner Exec: %v, want not found", err)
	}
	// Stop, then calls are refused with not_running.
	if _, err := m.Stop(ctx, "key_a", sb.ID); err != nil {
		t.Fatal(err)
	}
	sb = waitState(t, m, "key_a", sb.ID, sandbox.StateStopped)
	if sb.StopReason != sandbox.ReasonRequested || sb.EndedAt == nil {
		t.Errorf("stopped %+v", sb)
	}
	if _, err := exec(ctx, m, "key_a", sb.ID, agentproto.ExecRequest{Command: "true"}); errdefs.Code(err) != "not_running" {
		t.Errorf("exec after stop: %v, want not_running", err)
	}
	// Delete twice answers the same; Get then says not found.
	d1, err := m.Delete(ctx, "key_a", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := m.Delete(ctx, "key_a", sb.ID)
	if err != nil || d1.State != sandbox.StateDeleted || !d2.DeletedAt.Equal(*d1.DeletedAt) {
		t.Errorf("delete twice: %+v / %+v, %v", d1, d2, err)
	}
	if _, err := m.Get(ctx, "key_a", sb.ID); !errdefs.IsNotFound(err) {
		t.Errorf("get after delete: %v", err)
	}
}

func TestLeaseClock(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	stopSpec, delSpec := spec(), spec()
	delSpec.OnLeaseEnd = sandbox.LeaseEndDelete
	a, _ := m.Create(ctx, "k", stopSpec)
	b, _ := m.Create(ctx, "k", delSpec)
	waitState(t, m, "k", a.ID, sandbox.StateRunning)
	waitState(t, m, "k", b.ID, sandbox.StateRunning)

	e.clock.Advance(59 * time.Second)
	if ended := m.Reaper.ExpireLeases(ctx); len(ended) != 0 {
		t.Fatalf("at 59s ended %v, want none", ended)
	}
	// Extending a: its lease now ends 30 s from now (89 s after ready).
	if _, err := m.Extend(ctx, "k", a.ID, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(1 * time.Second)
	if ended := m.Reaper.ExpireLeases(ctx); len(ended) != 1 || ended[0] != b.ID {
		t.Fatalf("at 60s ended %v, want only %s", ended, b.ID)
	}
	waitState(t, m, "k", b.ID, sandbox.StateDeleted)
	e.clock.Advance(29 * time.Second)
	if ended := m.Reaper.ExpireLeases(ctx); len(ended) != 1 || ended[0] != a.ID {
		t.Fatalf("at 89s ended %v, want %s", ended, a.ID)
	}
	sb := waitState(t, m, "k", a.ID, sandbox.StateStopped)
	if sb.StopReason != sandbox.ReasonLeaseExpired {
		t.Errorf("stopReason = %q, want lease_expired", sb.StopReason)
	}
}

func TestBootRetriesOnceThenFails(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()

	e.drv.HangStarts(1) // first attempt hangs, second boots
	sb, _ := m.Create(ctx, "k", spec())
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)

	e.drv.HangStarts(2) // both attempts hang
	sb, _ = m.Create(ctx, "k", spec())
	sb = waitState(t, m, "k", sb.ID, sandbox.StateStopped)
	if sb.StopReason != sandbox.ReasonStartFailed {
		t.Errorf("stopReason = %q, want start_failed", sb.StopReason)
	}
	if e.drv.Starts() != 4 {
		t.Errorf("%d VM starts, want 4 (two creates, one retry each)", e.drv.Starts())
	}
}

func TestRecoverAfterRestart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m1 := e.manager()
	keep, _ := m1.Create(ctx, "k", spec())
	lost, _ := m1.Create(ctx, "k", spec())
	waitState(t, m1, "k", keep.ID, sandbox.StateRunning)
	waitState(t, m1, "k", lost.ID, sandbox.StateRunning)
	if _, err := exec(ctx, m1, "k", keep.ID, agentproto.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}

	// The "server" goes away without stopping anything; one VM dies.
	m1.Close()
	e.drv.Machine(lost.ID).Stop(ctx)
	m2 := e.manager()
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	sb := waitState(t, m2, "k", lost.ID, sandbox.StateStopped)
	if sb.StopReason != sandbox.ReasonLostOnRestart {
		t.Errorf("lost sandbox stopReason = %q, want lost_on_restart", sb.StopReason)
	}
	// The survivor keeps running and answers through the new manager once
	// it has reconnected.
	waitState(t, m2, "k", keep.ID, sandbox.StateRunning)
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := exec(ctx, m2, "k", keep.ID, agentproto.ExecRequest{Command: `echo "$GREETING"`})
		if err == nil {
			if string(res.Stdout) != "hello\n" {
				t.Errorf("env after reattach: %q", res.Stdout)
			}
			break
		}
		if errdefs.Code(err) != "guest_busy" || time.Now().After(deadline) {
			t.Fatalf("exec after reattach: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestStopDuringBoot(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	e.drv.HangStarts(2)
	sb, _ := m.Create(ctx, "k", spec())
	// Wait until the first (hanging) VM has started, then stop.
	deadline := time.Now().Add(10 * time.Second)
	for {
		started := e.drv.Starts()
		if started > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no VM started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := m.Stop(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	got := waitState(t, m, "k", sb.ID, sandbox.StateStopped)
	if got.StopReason != sandbox.ReasonRequested {
		t.Errorf("stopReason = %q, want requested", got.StopReason)
	}
	if e.drv.Starts() != 1 {
		t.Errorf("%d VM starts, want 1: a stopped sandbox must not retry its boot", e.drv.Starts())
	}
	if mach := e.drv.Machine(sb.ID); !mach.Stopped() {
		t.Error("the VM of a sandbox stopped while booting still runs")
	}
}

func TestRecoverFinishesInterruptedDelete(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m1 := e.manager()
	sb, _ := m1.Create(ctx, "k", spec())
	waitState(t, m1, "k", sb.ID, sandbox.StateRunning)
	dir := e.dir + "/sandboxes/" + sb.ID
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A crash between stopping for a delete and removing the disk: the
	// record says stopped (reason deleted) and the files are still there.
	m1.Close()
	e.drv.Machine(sb.ID).Stop(ctx)
	now := e.clock.Now()
	if _, err := e.st.UpdateSandbox(ctx, sb.ID, func(rec *sandbox.Sandbox) bool {
		rec.State, rec.StopReason, rec.EndedAt = sandbox.StateStopped, sandbox.ReasonDeleted, &now
		return true
	}); err != nil {
		t.Fatal(err)
	}

	m2 := e.manager()
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := e.st.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != sandbox.StateDeleted || got.DeletedAt == nil {
		t.Fatalf("after recovery: %+v, %v; want deleted", got, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("sandbox files still there: %v", err)
	}
}

// exec runs a command in a sandbox through the manager's one way in.
func exec(ctx context.Context, m *sandbox.Manager, owner, id string, req guest.ExecRequest) (*guest.ExecResult, error) {
	_, g, err := m.Guest(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return g.Exec(ctx, req, nil)
}

// TestLeaseEndingIsTold: a lease longer than two minutes is told once,
// a minute before it ends (and again after an extension brings its new
// end near), in the sandbox's trail and its owner's feed.
func TestLeaseEndingIsTold(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	long, short := spec(), spec()
	long.TimeoutSeconds, short.TimeoutSeconds = 600, 100
	a, _ := m.Create(ctx, "k", long)
	b, _ := m.Create(ctx, "k", short)
	waitState(t, m, "k", a.ID, sandbox.StateRunning)
	waitState(t, m, "k", b.ID, sandbox.StateRunning)
	told := func() []string {
		t.Helper()
		events, err := e.st.ListFeed(ctx, webhook.FeedQuery{Owner: "k", Type: webhook.SandboxLeaseEnding, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, ev := range events {
			ids = append(ids, ev.ResourceID)
		}
		return ids
	}
	e.clock.Advance(530 * time.Second)
	m.Reaper.ExpireLeases(ctx)
	if got := told(); len(got) != 0 {
		t.Fatalf("70 s before the end: told %v, want nobody", got)
	}
	e.clock.Advance(20 * time.Second)
	m.Reaper.ExpireLeases(ctx)
	m.Reaper.ExpireLeases(ctx)
	if got := told(); len(got) != 1 || got[0] != a.ID {
		t.Fatalf("50 s before the end, twice: told %v, want %s once (a 100 s lease is not told)", got, a.ID)
	}
	trail, err := e.st.ListEvents(ctx, a.ID, 0)
	if err != nil || !slices.ContainsFunc(trail, func(ev store.Event) bool {
		return ev.Type == "lease_ending" && ev.Data["onLeaseEnd"] == sandbox.LeaseEndStop
	}) {
		t.Errorf("the trail of %s has no lease_ending: %+v, %v", a.ID, trail, err)
	}
	if _, err := m.Extend(ctx, "k", a.ID, 100*time.Second); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(45 * time.Second)
	m.Reaper.ExpireLeases(ctx)
	if got := told(); len(got) != 2 {
		t.Fatalf("after an extension brought the end near again: told %v, want %s twice", got, a.ID)
	}
}

// TestSecretEnvReachesGuests: a sandbox gets its egress secrets'
// placeholders from its first command, under its own variables; a
// running one gets a change when Apply is told of its key; one of
// another key keeps what it had.
func TestSecretEnvReachesGuests(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	placeholders := map[string]string{"API_TOKEN": "emberbox-secret-1", "GREETING": "from-a-secret"}
	m := e.managerWith(func(cfg *sandbox.Config) {
		cfg.SecretEnv = func(owner, id string, labels map[string]string) map[string]string {
			mu.Lock()
			defer mu.Unlock()
			if owner != "k" {
				return nil
			}
			return maps.Clone(placeholders)
		}
	})
	ctx := context.Background()
	sb, err := m.Create(ctx, "k", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	echo := func(owner, id string) string {
		t.Helper()
		res, err := exec(ctx, m, owner, id, guest.ExecRequest{Command: "echo $API_TOKEN/$GREETING"})
		if err != nil {
			t.Fatal(err)
		}
		return string(res.Stdout)
	}
	// The sandbox's own GREETING wins over a secret's.
	if got := echo("k", sb.ID); got != "emberbox-secret-1/hello\n" {
		t.Errorf("first command: %q", got)
	}
	mu.Lock()
	placeholders = map[string]string{"API_TOKEN": "emberbox-secret-2"}
	mu.Unlock()
	m.Secrets.Apply(ctx, []string{"other"})
	if got := echo("k", sb.ID); got != "emberbox-secret-1/hello\n" {
		t.Errorf("after a change told of another key: %q", got)
	}
	m.Secrets.Apply(ctx, []string{"k"})
	if got := echo("k", sb.ID); got != "emberbox-secret-2/hello\n" {
		t.Errorf("after the change: %q", got)
	}
	mu.Lock()
	placeholders = nil
	mu.Unlock()
	m.Secrets.Apply(ctx, nil)
	if got := echo("k", sb.ID); got != "/hello\n" {
		t.Errorf("after the secrets were deleted: %q", got)
	}
}
