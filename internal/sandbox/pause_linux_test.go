package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/vmm"
	"github.com/emberbox/emberbox/internal/vmm/vmmtest"
)

func running(t *testing.T, m *sandbox.Manager, s sandbox.CreateSpec) *sandbox.Sandbox {
	t.Helper()
	sb, err := m.Create(context.Background(), "k", s)
	if err != nil {
		t.Fatal(err)
	}
	return waitState(t, m, "k", sb.ID, sandbox.StateRunning)
}

func pause(t *testing.T, m *sandbox.Manager, id string) *sandbox.Sandbox {
	t.Helper()
	if _, err := m.Pause(context.Background(), "k", id); err != nil {
		t.Fatal(err)
	}
	return waitState(t, m, "k", id, sandbox.StatePaused)
}

func wake(t *testing.T, m *sandbox.Manager, id string) *sandbox.Sandbox {
	t.Helper()
	if _, err := m.Wake(context.Background(), "k", id, nil); err != nil {
		t.Fatal(err)
	}
	return waitState(t, m, "k", id, sandbox.StateRunning)
}

func (e *env) spec(id string) vmm.Spec {
	return vmm.Spec{ID: id, Dir: filepath.Join(e.dir, "sandboxes", id)}
}

func TestPauseWakeCyclesKeepState(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	sb := running(t, m, spec())
	file := filepath.Join(t.TempDir(), "kept")
	if _, err := exec(ctx, m, "k", sb.ID, agentproto.ExecRequest{Command: "echo kept > " + file}); err != nil {
		t.Fatal(err)
	}
	_, g, err := m.Guest(ctx, "k", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	proc, err := g.Spawn(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		p := pause(t, m, sb.ID)
		if p.PausedAt == nil || p.VM != nil || p.ExpiresAt != nil {
			t.Fatalf("cycle %d: paused record %+v, want pausedAt, no vm, no lease", i, p)
		}
		if !e.drv.Saved(e.spec(sb.ID)) {
			t.Fatalf("cycle %d: no saved state after pause", i)
		}
		// Pausing again answers the paused sandbox.
		if again, err := m.Pause(ctx, "k", sb.ID); err != nil || again.State != sandbox.StatePaused {
			t.Fatalf("second pause: %v, %v", again, err)
		}
		w := wake(t, m, sb.ID)
		if w.PausedAt != nil || w.ExpiresAt == nil || !w.ExpiresAt.Equal(e.clock.Now().Add(60*time.Second)) {
			t.Errorf("cycle %d: woken record pausedAt %v expiresAt %v, want a new lease of 60 s", i, w.PausedAt, w.ExpiresAt)
		}
		if _, err := m.Wake(ctx, "k", sb.ID, nil); errdefs.Code(err) != "not_paused" || !errdefs.IsConflict(err) {
			t.Errorf("wake of a running sandbox: %v, want conflict not_paused", err)
		}
		res, err := exec(ctx, m, "k", sb.ID, agentproto.ExecRequest{Command: "cat " + file})
		if err != nil || string(res.Stdout) != "kept\n" {
			t.Fatalf("cycle %d: file after wake: %q, %v", i, res.Stdout, err)
		}
		_, g, err := m.Guest(ctx, "k", sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := g.Process(ctx, proc.ID); err != nil || info.State != "running" {
			t.Fatalf("cycle %d: process after wake: %+v, %v", i, info, err)
		}
	}
	// The process ends before the test does (goleak).
	_, g, err = m.Guest(ctx, "k", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	killProcess(t, g, proc.ID)
	if e.drv.Resumes() != 3 || e.drv.Starts() != 1 {
		t.Errorf("%d resumes and %d starts, want 3 and 1", e.drv.Resumes(), e.drv.Starts())
	}
}

func TestAutoWake(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	on := running(t, m, spec())
	offSpec := spec()
	offSpec.AutoWake = new(bool)
	off := running(t, m, offSpec)
	pause(t, m, on.ID)
	pause(t, m, off.ID)

	res, err := exec(ctx, m, "k", on.ID, agentproto.ExecRequest{Command: `echo "$GREETING"`})
	if err != nil {
		t.Fatalf("exec on a paused sandbox with autoWake: %v", err)
	}
	if string(res.Stdout) != "hello\n" {
		t.Fatalf("exec on a paused sandbox with autoWake: %q", res.Stdout)
	}
	if sb, _ := m.Get(ctx, "k", on.ID); sb.State != sandbox.StateRunning {
		t.Errorf("after the call the sandbox is %s, want running", sb.State)
	}
	_, err = exec(ctx, m, "k", off.ID, agentproto.ExecRequest{Command: "true"})
	if errdefs.Code(err) != sandbox.CodeSandboxPaused || !errdefs.IsConflict(err) {
		t.Errorf("exec on a paused sandbox without autoWake: %v, want conflict sandbox_paused", err)
	}
	if sb, _ := m.Get(ctx, "k", off.ID); sb.State != sandbox.StatePaused {
		t.Errorf("a refused call woke the sandbox: %s", sb.State)
	}
}

func TestIdlePauseAndPersistent(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	idle := spec()
	idle.TimeoutSeconds, idle.IdlePauseSeconds = 0, 60
	persistent := idle
	persistent.Persistent = true
	a := running(t, m, idle)
	b := running(t, m, persistent)
	if a.ExpiresAt != nil || b.ExpiresAt != nil {
		t.Fatalf("sandboxes without a time limit got leases: %v, %v", a.ExpiresAt, b.ExpiresAt)
	}
	e.clock.Advance(59 * time.Second)
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 0 {
		t.Fatalf("at 59 s idle: %v paused, want none", got)
	}
	// A call is activity: the idle time starts again.
	if _, err := exec(ctx, m, "k", a.ID, agentproto.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(59 * time.Second)
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 0 {
		t.Fatalf("59 s after a call: %v paused, want none", got)
	}
	e.clock.Advance(time.Second)
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 1 || got[0] != a.ID {
		t.Fatalf("60 s idle: %v paused, want %s only (persistent never idles)", got, a.ID)
	}
	waitState(t, m, "k", a.ID, sandbox.StatePaused)
	e.clock.Advance(24 * time.Hour)
	m.Reaper.ExpireLeases(ctx)
	if sb, _ := m.Get(ctx, "k", b.ID); sb.State != sandbox.StateRunning {
		t.Errorf("persistent sandbox is %s after a day, want running", sb.State)
	}
}

// TestWorkInFlightIsActivity: a call into the guest keeps its sandbox
// awake for as long as it runs, however long past idlePauseSeconds, and the
// idle time starts when the last call ends.
func TestWorkInFlightIsActivity(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	idle := spec()
	idle.TimeoutSeconds, idle.IdlePauseSeconds = 0, 60
	a := running(t, m, idle)

	// Two calls in flight (an exec's stream, a terminal): contexts that
	// end when the call does.
	exec1, end1 := context.WithCancel(ctx)
	term, end2 := context.WithCancel(ctx)
	defer end1()
	defer end2()
	for _, c := range []context.Context{exec1, term} {
		if _, _, err := m.Guest(c, "k", a.ID); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.CallsInFlight(a.ID); n != 2 {
		t.Fatalf("%d calls counted in flight, want 2", n)
	}
	e.clock.Advance(10 * time.Minute)
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 0 {
		t.Fatalf("10 min into two calls: %v paused, want none", got)
	}
	end1()
	e.clock.Advance(10 * time.Minute)
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 0 {
		t.Fatalf("20 min into a call whose sibling ended: %v paused, want none", got)
	}
	// An end is counted by context.AfterFunc in a goroutine of its own:
	// wait for it before the clock moves on.
	inFlight := func(want int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); m.CallsInFlight(a.ID) != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d calls counted in flight, want %d", m.CallsInFlight(a.ID), want)
			}
		}
	}
	inFlight(1)
	end2()
	inFlight(0)
	e.clock.Advance(59 * time.Second)
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 0 {
		t.Fatalf("59 s after the last call ended: %v paused, want none", got)
	}
	e.clock.Advance(time.Second)
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 1 || got[0] != a.ID {
		t.Fatalf("60 s after the last call: %v paused, want %s", got, a.ID)
	}
	waitState(t, m, "k", a.ID, sandbox.StatePaused)
}

func TestLeaseEndPause(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	s := spec()
	s.OnLeaseEnd = sandbox.LeaseEndPause
	sb := running(t, m, s)
	e.clock.Advance(60 * time.Second)
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 1 {
		t.Fatalf("lease end paused %v", got)
	}
	waitState(t, m, "k", sb.ID, sandbox.StatePaused)
	// A paused sandbox has no lease to expire.
	e.clock.Advance(time.Hour)
	if got := m.Reaper.ExpireLeases(ctx); len(got) != 0 {
		t.Errorf("a paused sandbox's lease ended again: %v", got)
	}
	timeout := 120
	if _, err := m.Wake(ctx, "k", sb.ID, &timeout); err != nil {
		t.Fatal(err)
	}
	w := waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	if w.TimeoutSeconds != 120 || w.ExpiresAt == nil || !w.ExpiresAt.Equal(e.clock.Now().Add(120*time.Second)) {
		t.Errorf("wake with timeoutSeconds 120: timeout %d expiresAt %v", w.TimeoutSeconds, w.ExpiresAt)
	}
}

func TestWakeWithoutCapacityStaysPaused(t *testing.T) {
	e := newEnv(t)
	ledger := admission.New(admission.Config{Capacity: admission.Capacity{VCPU: 2}})
	m := e.managerWith(func(c *sandbox.Config) { c.Admission = ledger })
	ctx := context.Background()
	a := running(t, m, spec())
	pause(t, m, a.ID)
	if u := ledger.Total(); u.VCPU != 0 || u.DiskMiB != 4096 {
		t.Errorf("a paused sandbox holds %+v, want its disk only", u)
	}
	b := running(t, m, spec())
	_, err := m.Wake(ctx, "k", a.ID, nil)
	if errdefs.Code(err) != admission.CodeNoCapacity {
		t.Fatalf("wake with no room: %v, want no_capacity", err)
	}
	if sb, _ := m.Get(ctx, "k", a.ID); sb.State != sandbox.StatePaused {
		t.Errorf("after a refused wake the sandbox is %s, want paused", sb.State)
	}
	if _, err := m.Stop(ctx, "k", b.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", b.ID, sandbox.StateStopped)
	wake(t, m, a.ID)
	if u := ledger.Total(); u.VCPU != 2 || u.Boots != 0 {
		t.Errorf("a woken sandbox holds %+v, want its vCPUs and no boot slot", u)
	}
}

func TestFailedWakeStaysPaused(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	sb := running(t, m, spec())
	pause(t, m, sb.ID)
	e.drv.FailResumes(1)
	if _, err := m.Wake(ctx, "k", sb.ID, nil); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StatePaused)
	wake(t, m, sb.ID)

	// A pause that fails leaves the sandbox running.
	e.drv.FailPauses(1)
	if _, err := m.Pause(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ := m.Get(ctx, "k", sb.ID)
		if got.State == sandbox.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a failed pause the sandbox is %s, want running", got.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := exec(ctx, m, "k", sb.ID, agentproto.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Errorf("exec after a failed pause: %v", err)
	}
}

// setState rewrites a sandbox's record as a crash at some step would have
// left it.
func (e *env) setState(id string, st sandbox.State) {
	e.t.Helper()
	if _, err := e.st.UpdateSandbox(context.Background(), id, func(sb *sandbox.Sandbox) bool {
		sb.State = st
		return true
	}); err != nil {
		e.t.Fatal(err)
	}
}

func TestRecoverInterruptedPauseAndWake(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m1 := e.manager()
	var ids []string
	for range 6 {
		ids = append(ids, running(t, m1, spec()).ID)
	}
	m1.Close()
	pausingAlive, pausingSaved, pausingLost := ids[0], ids[1], ids[2]
	resumingSaved, resumingAlive, resumingLost := ids[3], ids[4], ids[5]

	e.setState(pausingAlive, sandbox.StatePausing)
	// The pause saved the state and ended the VM; the record was not yet
	// written.
	if err := e.drv.Machine(pausingSaved).Pause(ctx); err != nil {
		t.Fatal(err)
	}
	e.setState(pausingSaved, sandbox.StatePausing)
	e.drv.Machine(pausingLost).Stop(ctx)
	e.setState(pausingLost, sandbox.StatePausing)
	// A wake recorded and its VM started, but the saved state not yet
	// used: the VM goes, the sandbox stays paused.
	if err := vmmtest.SaveState(e.spec(resumingSaved).Dir, resumingSaved); err != nil {
		t.Fatal(err)
	}
	e.setState(resumingSaved, sandbox.StateResuming)
	// A wake whose VM took its saved state: it goes on.
	e.setState(resumingAlive, sandbox.StateResuming)
	e.drv.Machine(resumingLost).Stop(ctx)
	e.setState(resumingLost, sandbox.StateResuming)

	continues := e.drv.Continues()
	m2 := e.manager()
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	waitState(t, m2, "k", pausingAlive, sandbox.StatePaused)
	waitState(t, m2, "k", pausingSaved, sandbox.StatePaused)
	if sb := waitState(t, m2, "k", pausingLost, sandbox.StateStopped); sb.StopReason != sandbox.ReasonLostOnRestart {
		t.Errorf("pausing sandbox with no vm and no saved state: reason %q", sb.StopReason)
	}
	waitState(t, m2, "k", resumingSaved, sandbox.StatePaused)
	if !e.drv.Machine(resumingSaved).Stopped() {
		t.Error("the vm of an interrupted wake beside its saved state still runs")
	}
	waitState(t, m2, "k", resumingAlive, sandbox.StateRunning)
	if e.drv.Continues() != continues+1 {
		t.Errorf("Continue called %d times, want once for the resumed vm", e.drv.Continues()-continues)
	}
	waitState(t, m2, "k", resumingLost, sandbox.StateStopped)
	for _, id := range []string{pausingAlive, pausingSaved, resumingSaved} {
		wake(t, m2, id)
	}
	if _, err := exec(ctx, m2, "k", resumingAlive, agentproto.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Errorf("exec in a sandbox whose wake was finished after a restart: %v", err)
	}
}

func TestPausedSurvivesRestart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ledger := admission.New(admission.Config{})
	m1 := e.manager()
	sb := running(t, m1, spec())
	pause(t, m1, sb.ID)
	m1.Close()
	m2 := e.managerWith(func(c *sandbox.Config) { c.Admission = ledger })
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if u := ledger.Total(); u.Sandboxes != 1 || u.VCPU != 0 || u.DiskMiB != 4096 {
		t.Errorf("a paused sandbox after a restart holds %+v, want its disk only", u)
	}
	wake(t, m2, sb.ID)
	if _, err := exec(ctx, m2, "k", sb.ID, agentproto.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Error(err)
	}
}

func TestRestart(t *testing.T) {
	e := newEnv(t)
	m := e.managerWith(func(c *sandbox.Config) { c.StoppedDiskRetention = time.Hour })
	ctx := context.Background()
	sb := running(t, m, spec())
	if _, err := m.Stop(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateStopped)
	if _, err := m.Restart(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	r := waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	if r.StopReason != "" || r.EndedAt != nil || strings.Join(r.EnvNames, ",") != "GREETING" {
		t.Errorf("restarted record %+v", r)
	}
	res, err := exec(ctx, m, "k", sb.ID, agentproto.ExecRequest{Command: `echo "$GREETING"`})
	if err != nil || string(res.Stdout) != "hello\n" {
		t.Errorf("env after restart: %q, %v", res.Stdout, err)
	}
	if e.drv.Starts() != 2 {
		t.Errorf("%d starts, want 2", e.drv.Starts())
	}
	// Restarting a running sandbox answers it as it is.
	if again, err := m.Restart(ctx, "k", sb.ID); err != nil || again.State != sandbox.StateRunning {
		t.Errorf("restart of a running sandbox: %v, %v", again, err)
	}
	if _, err := m.Stop(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateStopped)
	e.clock.Advance(2 * time.Hour)
	if removed := m.Reaper.RemoveStoppedDisks(ctx); len(removed) != 1 {
		t.Fatalf("retention removed %v", removed)
	}
	_, err = m.Restart(ctx, "k", sb.ID)
	if errdefs.Code(err) != "disk_removed" || !errdefs.IsConflict(err) {
		t.Errorf("restart after the disk was removed: %v, want conflict disk_removed", err)
	}
	if _, err := os.Stat(e.spec(sb.ID).Dir); !os.IsNotExist(err) {
		t.Errorf("files of the removed disk: %v", err)
	}
}

func TestUpdate(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	sb := running(t, m, spec())
	name, off, timeout, idle := "renamed", false, 120, 90
	e.clock.Advance(10 * time.Second)
	other := "there"
	u, err := m.Update(ctx, "k", sb.ID, sandbox.UpdateSpec{Name: &name, Labels: map[string]string{"a": "b"},
		AutoWake: &off, TimeoutSeconds: &timeout, IdlePauseSeconds: &idle,
		Env: map[string]*string{"OTHER": &other}})
	if err != nil {
		t.Fatal(err)
	}
	if u.Name != name || u.Labels["a"] != "b" || u.AutoWake || u.IdlePauseSeconds != 90 || u.TimeoutSeconds != 120 ||
		!u.ExpiresAt.Equal(e.clock.Now().Add(120*time.Second)) || strings.Join(u.EnvNames, ",") != "GREETING,OTHER" {
		t.Errorf("updated record %+v", u)
	}
	res, err := exec(ctx, m, "k", sb.ID, agentproto.ExecRequest{Command: `echo "$GREETING $OTHER"`})
	if err != nil || string(res.Stdout) != "hello there\n" {
		t.Errorf("env after update: %q, %v", res.Stdout, err)
	}
	zero := 0
	if u, err = m.Update(ctx, "k", sb.ID, sandbox.UpdateSpec{TimeoutSeconds: &zero, Env: map[string]*string{"GREETING": nil}}); err != nil {
		t.Fatal(err)
	}
	if u.ExpiresAt != nil || strings.Join(u.EnvNames, ",") != "OTHER" {
		t.Errorf("after removing the limit and a variable: expiresAt %v env %v", u.ExpiresAt, u.EnvNames)
	}
	if _, err := m.Update(ctx, "other", sb.ID, sandbox.UpdateSpec{Name: &name}); !errdefs.IsNotFound(err) {
		t.Errorf("update by another key: %v, want not found", err)
	}
}

func TestStopAndDeletePaused(t *testing.T) {
	e := newEnv(t)
	ledger := admission.New(admission.Config{})
	m := e.managerWith(func(c *sandbox.Config) { c.Admission = ledger })
	ctx := context.Background()
	a := running(t, m, spec())
	b := running(t, m, spec())
	pause(t, m, a.ID)
	pause(t, m, b.ID)
	if _, err := m.Stop(ctx, "k", a.ID); err != nil {
		t.Fatal(err)
	}
	if sb := waitState(t, m, "k", a.ID, sandbox.StateStopped); sb.StopReason != sandbox.ReasonRequested {
		t.Errorf("stopped paused sandbox: reason %q", sb.StopReason)
	}
	if _, err := m.Delete(ctx, "k", b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get(ctx, "k", b.ID); !errdefs.IsNotFound(err) {
		t.Errorf("deleted paused sandbox: %v", err)
	}
	if exists(e.spec(b.ID).Dir) {
		t.Error("a deleted paused sandbox's files (its saved state) are still there")
	}
	if u := ledger.Total(); u.Sandboxes != 0 {
		t.Errorf("the ledger still holds %+v", u)
	}
}

// TestCallsDuringPause runs guest calls while the sandbox is paused over
// and over: each call is served (autoWake) or answered with a retryable
// code (or sandbox_paused, when a pause cut it), and nothing deadlocks.
func TestCallsDuringPause(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	sb := running(t, m, spec())
	done := make(chan error, 1)
	go func() {
		for range 20 {
			if _, err := exec(ctx, m, "k", sb.ID, agentproto.ExecRequest{Argv: []string{"true"}}); err != nil &&
				!slices.Contains([]string{"guest_busy", "guest_unavailable", "wake_failed", sandbox.CodeSandboxPaused}, errdefs.Code(err)) {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range 5 {
		if _, err := m.Pause(ctx, "k", sb.ID); err != nil && !errdefs.IsConflict(err) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("a call during pauses: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("calls during pauses did not finish")
	}
	// Once the pauses stop, a call wakes it and is served.
	if _, err := exec(ctx, m, "k", sb.ID, agentproto.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Errorf("a call after the pauses: %v", err)
	}
	if got, _ := m.Get(ctx, "k", sb.ID); got.State != sandbox.StateRunning {
		t.Errorf("after the call the sandbox is %s", got.State)
	}
}

// TestCallCutByPause: an exec in flight when its sandbox pauses answers
// 409 sandbox_paused with the pause's reason, not a lost connection; its
// command is still running after the wake.
func TestCallCutByPause(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	sb := running(t, m, spec())
	cut := make(chan error, 1)
	go func() {
		_, err := exec(ctx, m, "k", sb.ID, agentproto.ExecRequest{Argv: []string{"sleep", "30"}, TimeoutMs: 60_000})
		cut <- err
	}()
	_, g, err := m.Guest(ctx, "k", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var procID string
	for deadline := time.Now().Add(10 * time.Second); procID == ""; time.Sleep(10 * time.Millisecond) {
		procs, err := g.Processes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range procs {
			if p.State == "running" {
				procID = p.ID
			}
		}
		if procID == "" && time.Now().After(deadline) {
			t.Fatal("the exec's process never showed as running")
		}
	}
	pause(t, m, sb.ID)
	select {
	case err := <-cut:
		if errdefs.Code(err) != sandbox.CodeSandboxPaused || !errdefs.IsConflict(err) {
			t.Fatalf("exec cut by a pause: %v, want conflict sandbox_paused", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the exec did not end with the pause")
	}
	wake(t, m, sb.ID)
	_, g, err = m.Guest(ctx, "k", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := g.Process(ctx, procID); err != nil || info.State != "running" {
		t.Fatalf("the command after the wake: %+v, %v", info, err)
	}
	killProcess(t, g, procID)
}

// killProcess SIGKILLs guest process id and waits until it is no longer
// running, so that it ends before the test does (goleak).
func killProcess(t *testing.T, g guest.Handle, id string) {
	t.Helper()
	ctx := context.Background()
	if _, err := g.Signal(ctx, id, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if info, err := g.Process(ctx, id); err == nil && info.State != "running" {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("process still running after SIGKILL: %+v, %v", info, err)
		}
	}
}
