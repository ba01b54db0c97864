package sandbox_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// These tests force the interleavings of two transitions of one sandbox
// that a read-modify-write without atomicity gets wrong: the first is held
// between its read and its write while the second starts, and the outcome
// must be one of the two orders, never a mix. Run them with -race.

// holdFirst arms m so that the first update whose new record satisfies
// match is held between its read and its write until release is closed;
// held is closed once it is held. Updates of other sandboxes pass.
func holdFirst(m *sandbox.Manager, match func(*sandbox.Sandbox) bool) (held, release chan struct{}) {
	held, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	sandbox.SetUpdateHooks(m, nil, func(id string, sb *sandbox.Sandbox) {
		if !match(sb) {
			return
		}
		first := false
		once.Do(func() { first = true })
		if first {
			close(held)
			<-release
		}
	})
	return held, release
}

// onUpdateStart returns a channel closed when an update of id next begins.
func onUpdateStart(m *sandbox.Manager, id string) <-chan struct{} {
	began := make(chan struct{})
	var once sync.Once
	sandbox.SetUpdateHooks(m, func(got string) {
		if got == id {
			once.Do(func() { close(began) })
		}
	}, nil)
	return began
}

func countEvents(t *testing.T, e *env, id, typ string) int {
	t.Helper()
	evs, err := e.st.ListEvents(context.Background(), id, 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

func TestExtendVersusStop(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	sb, err := m.Create(ctx, "k", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)

	// The extend reads the running record and is held before its write.
	held, release := holdFirst(m, func(s *sandbox.Sandbox) bool { return s.State == sandbox.StateRunning })
	extended := make(chan error, 1)
	go func() {
		_, err := m.Extend(ctx, "k", sb.ID, 30*time.Minute)
		extended <- err
	}()
	<-held
	// A stop comes in meanwhile; the extend goes on once it has begun.
	began := onUpdateStart(m, sb.ID)
	stopped := make(chan error, 1)
	go func() {
		_, err := m.Stop(ctx, "k", sb.ID)
		stopped <- err
	}()
	<-began
	close(release)
	if err := <-extended; err != nil {
		t.Fatalf("extend: %v", err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	got := waitState(t, m, "k", sb.ID, sandbox.StateStopped)
	if got.StopReason != sandbox.ReasonRequested {
		t.Errorf("stop reason %q, want %q", got.StopReason, sandbox.ReasonRequested)
	}
	if !e.drv.Machine(sb.ID).Stopped() {
		t.Error("the sandbox is recorded stopped but its VM still runs")
	}
}

func TestStopVersusLeaseExpiry(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	sb, err := m.Create(ctx, "k", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)

	// The lease clock's stop is held before its write; a requested stop
	// comes in meanwhile.
	e.clock.Advance(2 * time.Minute)
	held, release := holdFirst(m, func(s *sandbox.Sandbox) bool { return s.State == sandbox.StateStopping })
	expired := make(chan []string, 1)
	go func() { expired <- m.Reaper.ExpireLeases(ctx) }()
	<-held
	began := onUpdateStart(m, sb.ID)
	stopped := make(chan error, 1)
	go func() {
		_, err := m.Stop(ctx, "k", sb.ID)
		stopped <- err
	}()
	<-began
	close(release)
	<-expired
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	got := waitState(t, m, "k", sb.ID, sandbox.StateStopped)
	// The lease got there first; the requested stop found it stopping.
	if got.StopReason != sandbox.ReasonLeaseExpired {
		t.Errorf("stop reason %q, want %q", got.StopReason, sandbox.ReasonLeaseExpired)
	}
	m.Close() // the stop's goroutine records the event after the state
	if n := countEvents(t, e, sb.ID, "stopped"); n != 1 {
		t.Errorf("%d stopped events, want 1", n)
	}
	if !e.drv.Machine(sb.ID).Stopped() {
		t.Error("VM still runs")
	}
}

func TestDeleteVersusBootFinishing(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	// The boot's last step (recording the sandbox running) is held; a
	// delete comes in meanwhile.
	held, release := holdFirst(m, func(s *sandbox.Sandbox) bool { return s.State == sandbox.StateRunning })
	sb, err := m.Create(ctx, "k", spec())
	if err != nil {
		t.Fatal(err)
	}
	<-held
	began := onUpdateStart(m, sb.ID)
	deleted := make(chan error, 1)
	go func() {
		_, err := m.Delete(ctx, "k", sb.ID)
		deleted <- err
	}()
	<-began
	close(release)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	got, err := e.st.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != sandbox.StateDeleted {
		t.Fatalf("after delete: %+v, %v; want deleted", got, err)
	}
	if !e.drv.Machine(sb.ID).Stopped() {
		t.Error("VM still runs after the delete")
	}
	if _, err := os.Stat(e.dir + "/sandboxes/" + sb.ID); !os.IsNotExist(err) {
		t.Errorf("sandbox dir after delete: %v", err)
	}
}

func TestReattachVersusStop(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m1 := e.manager()
	sb, err := m1.Create(ctx, "k", sandbox.CreateSpec{VCPU: 1, MemoryMiB: 512, DiskMiB: 512, TimeoutSeconds: 600, OnLeaseEnd: sandbox.LeaseEndStop})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m1, "k", sb.ID, sandbox.StateRunning)
	m1.Close() // the VM keeps running

	// The new process reattaches, and a stop arrives while its watcher is
	// still connecting to the guest.
	m2 := e.manager()
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Stop(ctx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	got := waitState(t, m2, "k", sb.ID, sandbox.StateStopped)
	if got.StopReason != sandbox.ReasonRequested {
		t.Errorf("stop reason %q, want requested", got.StopReason)
	}
	if !e.drv.Machine(sb.ID).Stopped() {
		t.Error("VM still runs")
	}
	m2.Close() // the stop's goroutine records the event after the state
	if n := countEvents(t, e, sb.ID, "stopped"); n != 1 {
		t.Errorf("%d stopped events, want 1", n)
	}
}
