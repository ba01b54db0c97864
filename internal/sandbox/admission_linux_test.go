package sandbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// managerWith returns a manager of the env whose config edit changed.
func (e *env) managerWith(edit func(cfg *sandbox.Config)) *sandbox.Manager {
	cfg := sandbox.Config{Store: e.st, Driver: e.drv, DataDir: e.dir, BootTimeout: 2 * time.Second, Now: e.clock.Now}
	edit(&cfg)
	m := sandbox.New(cfg)
	e.t.Cleanup(m.Close)
	return m
}

// waitReleased waits until the ledger no longer holds id.
func waitReleased(t *testing.T, l *admission.Ledger, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.Held(id) {
		if time.Now().After(deadline) {
			t.Fatalf("the ledger still holds %s", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestAdmissionNoCapacityUntilStop(t *testing.T) {
	e := newEnv(t)
	ledger := admission.New(admission.Config{Capacity: admission.Capacity{VCPU: 4, MemoryMiB: 8192, Boots: 2}})
	m := e.managerWith(func(cfg *sandbox.Config) { cfg.Admission = ledger })
	ctx := context.Background()

	a, err := m.Create(ctx, "k", spec())
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(ctx, "j", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", a.ID, sandbox.StateRunning)
	waitState(t, m, "j", b.ID, sandbox.StateRunning)
	if got := ledger.Total(); got != (admission.Usage{Sandboxes: 2, VCPU: 4, MemoryMiB: 8192, DiskMiB: 8192}) {
		t.Errorf("ledger holds %+v, want two running sandboxes and no boot", got)
	}

	// Full: refused, and nothing is recorded.
	_, err = m.Create(ctx, "k", spec())
	var ce *errdefs.CodedError
	if !errors.As(err, &ce) || ce.Code != admission.CodeNoCapacity || !errdefs.IsConflict(err) || ce.RetryAfter <= 0 {
		t.Fatalf("create beyond capacity: %v, want no_capacity with a RetryAfter", err)
	}
	list, _, err := m.List(ctx, sandbox.ListOptions{OwnerKeyID: "k", IncludeStopped: true})
	if err != nil || len(list) != 1 {
		t.Fatalf("sandboxes of k after a refused create: %d, %v; want 1", len(list), err)
	}

	// A stop gives the room back.
	if _, err := m.Stop(ctx, "k", a.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", a.ID, sandbox.StateStopped)
	c, err := m.Create(ctx, "k", spec())
	if err != nil {
		t.Fatalf("create after a stop: %v", err)
	}
	waitState(t, m, "k", c.ID, sandbox.StateRunning)

	// So does a delete, and deleting the stopped one releases nothing
	// twice.
	for _, id := range []string{a.ID, c.ID} {
		if _, err := m.Delete(ctx, "k", id); err != nil {
			t.Fatal(err)
		}
	}
	waitReleased(t, ledger, c.ID)
	if got := ledger.Total(); got != (admission.Usage{Sandboxes: 1, VCPU: 2, MemoryMiB: 4096, DiskMiB: 4096}) {
		t.Errorf("after deletes the ledger holds %+v, want only b", got)
	}
}

func TestAdmissionReleasedOnFailedStart(t *testing.T) {
	e := newEnv(t)
	ledger := admission.New(admission.Config{Capacity: admission.Capacity{Boots: 1}})
	m := e.managerWith(func(cfg *sandbox.Config) { cfg.Admission = ledger })
	ctx := context.Background()

	e.drv.HangStarts(2) // both attempts hang: start_failed
	sb, err := m.Create(ctx, "k", spec())
	if err != nil {
		t.Fatal(err)
	}
	// Its boot slot is held while it boots.
	if _, err := m.Create(ctx, "k", spec()); errdefs.Code(err) != admission.CodeNoCapacity {
		t.Errorf("second boot at once: %v, want no_capacity", err)
	}
	got := waitState(t, m, "k", sb.ID, sandbox.StateStopped)
	if got.StopReason != sandbox.ReasonStartFailed {
		t.Fatalf("stopReason %q, want start_failed", got.StopReason)
	}
	if u := ledger.Total(); u != (admission.Usage{}) {
		t.Errorf("after a failed start the ledger holds %+v", u)
	}

	// A create the store refuses (the name is taken) holds nothing.
	named := spec()
	named.Name = "one"
	first, err := m.Create(ctx, "k", named)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", first.ID, sandbox.StateRunning)
	if _, err := m.Create(ctx, "k", named); errdefs.Code(err) != "name_taken" {
		t.Fatalf("second create of a name: %v, want name_taken", err)
	}
	if u := ledger.Total(); u.Sandboxes != 1 {
		t.Errorf("after a refused insert the ledger holds %+v, want one sandbox", u)
	}
}

// TestAdmissionRebuiltOnRecover: a new process's ledger holds what the
// live records say, and a sandbox found gone is released.
func TestAdmissionRebuiltOnRecover(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	capa := admission.Capacity{VCPU: 4, Boots: 2}
	m1 := e.managerWith(func(cfg *sandbox.Config) { cfg.Admission = admission.New(admission.Config{Capacity: capa}) })
	keep, _ := m1.Create(ctx, "k", spec())
	lost, _ := m1.Create(ctx, "k", spec())
	waitState(t, m1, "k", keep.ID, sandbox.StateRunning)
	waitState(t, m1, "k", lost.ID, sandbox.StateRunning)
	m1.Close()
	e.drv.Machine(lost.ID).Stop(ctx)

	ledger := admission.New(admission.Config{Capacity: capa})
	m2 := e.managerWith(func(cfg *sandbox.Config) { cfg.Admission = ledger })
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	waitState(t, m2, "k", lost.ID, sandbox.StateStopped)
	if !ledger.Held(keep.ID) || ledger.Held(lost.ID) {
		t.Errorf("after recovery: keep held %v, lost held %v; want true, false", ledger.Held(keep.ID), ledger.Held(lost.ID))
	}
	if got := ledger.Owner("k"); got != (admission.Usage{Sandboxes: 1, VCPU: 2, MemoryMiB: 4096, DiskMiB: 4096}) {
		t.Errorf("rebuilt usage of k %+v", got)
	}
	// One more fits (2 of 4 vCPUs held), a third does not.
	sb, err := m2.Create(ctx, "k", spec())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Create(ctx, "k", spec()); errdefs.Code(err) != admission.CodeNoCapacity {
		t.Errorf("create beyond the rebuilt capacity: %v, want no_capacity", err)
	}
	waitState(t, m2, "k", sb.ID, sandbox.StateRunning)
}

func TestLimitsAndLifetime(t *testing.T) {
	e := newEnv(t)
	m := e.managerWith(func(cfg *sandbox.Config) {
		cfg.Limits = sandbox.Limits{MaxVCPU: 2, MaxMemoryMiB: 4096, MaxDiskMiB: 4096, MaxLifetime: 90 * time.Second}
	})
	ctx := context.Background()

	big := spec()
	big.VCPU, big.MemoryMiB = 3, 8192
	_, err := m.Create(ctx, "k", big)
	var ce *errdefs.CodedError
	if !errors.As(err, &ce) || ce.Code != "invalid_request" || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("create above the limits: %v, want invalid_request", err)
	}
	issues, _ := ce.Details["issues"].([]map[string]string)
	if len(issues) != 2 || issues[0]["path"] != "memoryMiB" || issues[1]["path"] != "vcpu" ||
		issues[1]["message"] != "must be at most 2 on this server" {
		t.Errorf("issues %v, want memoryMiB and vcpu with their limits", issues)
	}
	long := spec()
	long.TimeoutSeconds = 91
	if _, err := m.Create(ctx, "k", long); errdefs.Code(err) != "invalid_request" {
		t.Errorf("timeout beyond the lifetime: %v, want invalid_request", err)
	}

	sb, err := m.Create(ctx, "k", spec()) // 60 s lease
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	end := sb.CreatedAt.Add(90 * time.Second)
	e.clock.Advance(50 * time.Second)
	got, err := m.Extend(ctx, "k", sb.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !got.ExpiresAt.Equal(end) {
		t.Errorf("extended to %v, want the lifetime's end %v", got.ExpiresAt, end)
	}
	if _, err := m.Extend(ctx, "k", sb.ID, time.Minute); errdefs.Code(err) != "lifetime_exceeded" || !errdefs.IsConflict(err) {
		t.Errorf("extend at the lifetime's end: %v, want lifetime_exceeded", err)
	}
	e.clock.Advance(40 * time.Second)
	if ended := m.Reaper.ExpireLeases(ctx); len(ended) != 1 {
		t.Errorf("at the lifetime's end %v ended, want the sandbox", ended)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateStopped)
}

// TestInternalSandboxChargedToItsKey: a sandbox of an internal owner (an
// image build's) counts against the quotas of the key its LabelQuotaKey
// names, also after a restart; the same label on a tenant's own sandbox
// charges nobody else.
func TestInternalSandboxChargedToItsKey(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	quota := admission.Quota{Sandboxes: 1}
	m1 := e.managerWith(func(cfg *sandbox.Config) { cfg.Admission = admission.New(admission.Config{Quota: quota}) })
	build := spec()
	build.Labels = map[string]string{sandbox.LabelQuotaKey: "key_a"}
	sb, err := m1.Create(ctx, "system:build", build)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m1, "system:build", sb.ID, sandbox.StateRunning)
	if _, err := m1.Create(ctx, "key_a", spec()); errdefs.Code(err) != admission.CodeQuotaExceeded {
		t.Errorf("key_a's create beside its build: %v, want quota_exceeded", err)
	}
	// A tenant cannot charge key_a by naming it.
	forged := spec()
	forged.Labels = map[string]string{sandbox.LabelQuotaKey: "key_a"}
	other, err := m1.Create(ctx, "key_b", forged)
	if err != nil {
		t.Fatalf("key_b's sandbox: %v", err)
	}
	waitState(t, m1, "key_b", other.ID, sandbox.StateRunning)
	m1.Close()

	ledger := admission.New(admission.Config{Quota: quota})
	m2 := e.managerWith(func(cfg *sandbox.Config) { cfg.Admission = ledger })
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if a, b, sys := ledger.Owner("key_a"), ledger.Owner("key_b"), ledger.Owner("system:build"); a.Sandboxes != 1 || b.Sandboxes != 1 || sys.Sandboxes != 0 {
		t.Errorf("after a restart key_a holds %+v, key_b %+v, system:build %+v; want one each for the keys", a, b, sys)
	}
	if _, err := m2.Delete(ctx, "system:build", sb.ID); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, ledger, sb.ID)
	if _, err := m2.Create(ctx, "key_a", spec()); err != nil {
		t.Errorf("key_a's create after its build ended: %v", err)
	}
}

// TestMeasuredRestartWithAHundred: a hundred default sandboxes run under
// measured admission on a host whose available memory shows what they
// use; the server restarts; the new process reattaches all hundred, holds
// their claims, charges each by its VM's reading as its watch begins (not
// by the start estimate), and admits on that.
func TestMeasuredRestartWithAHundred(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const n, rss = 100, 120 // MiB resident per idle sandbox
	var avail atomic.Int64
	avail.Store(23 << 10)
	newLedger := func() *admission.Ledger {
		return admission.New(admission.Config{VMOverheadMiB: 512,
			MemAvailableMiB: func() (int64, error) { return avail.Load(), nil }, MemReserveMiB: 2048,
			Measured: &admission.MeasuredConfig{StartMiB: 512, HeadroomMiB: 64}})
	}
	m1 := e.managerWith(func(cfg *sandbox.Config) { cfg.Admission = newLedger() })
	var ids []string
	for range n {
		sb, err := m1.Create(ctx, "k", spec())
		if err != nil {
			t.Fatalf("create %d: %v", len(ids)+1, err)
		}
		waitState(t, m1, "k", sb.ID, sandbox.StateRunning)
		e.drv.Machine(sb.ID).SetRSS(rss << 20)
		avail.Add(-rss)
		m1.Meter.SettleAll(ctx)
		ids = append(ids, sb.ID)
	}
	m1.Close()

	ledger := newLedger()
	m2 := e.managerWith(func(cfg *sandbox.Config) { cfg.Admission = ledger })
	if err := m2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		waitState(t, m2, "k", id, sandbox.StateRunning)
	}
	if got := ledger.Owner("k"); got.Sandboxes != n || got.MemoryMiB != n*4096 {
		t.Errorf("after the restart the ledger holds %+v, want %d sandboxes", got, n)
	}
	// Each watch reads its VM as it begins.
	deadline := time.Now().Add(30 * time.Second)
	for ledger.Expected() != n*64 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := ledger.Expected(); got != n*64 {
		t.Fatalf("expected %d MiB of the reattached sandboxes, want %d (their headroom, after their readings)", got, n*64)
	}
	// 23552 − 12000 used − 6400 headroom − 512 ≥ 2048: one more fits.
	sb, err := m2.Create(ctx, "k", spec())
	if err != nil {
		t.Fatalf("a create after the restart: %v", err)
	}
	waitState(t, m2, "k", sb.ID, sandbox.StateRunning)
}
