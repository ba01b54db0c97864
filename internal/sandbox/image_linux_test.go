package sandbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// A sandbox of a custom image boots that image's disk, keeps it on its
// record, and hands it to its snapshots and their copies.
func TestCreateFromImage(t *testing.T) {
	e := newEnv(t)
	m := e.managerWith(func(cfg *sandbox.Config) { cfg.Boot.Rootfs = "/images/default.img" })
	ctx := context.Background()
	img := &sandbox.ImageRef{ID: "img-1", Rootfs: "/images/app.img", MinDiskMiB: 4096}

	small := spec()
	small.Image, small.DiskMiB = img, 3072
	if _, err := m.Create(ctx, "key_a", small); errdefs.Code(err) != "invalid_request" {
		t.Fatalf("create with a disk smaller than the image: %v, want invalid_request", err)
	}

	s := spec()
	s.Image = img
	sb, err := m.Create(ctx, "key_a", s)
	if err != nil {
		t.Fatal(err)
	}
	sb = waitState(t, m, "key_a", sb.ID, sandbox.StateRunning)
	if sb.ImageID != "img-1" || sb.Rootfs != "/images/app.img" {
		t.Errorf("record: image %q rootfs %q", sb.ImageID, sb.Rootfs)
	}
	if got := e.drv.Machine(sb.ID).Spec().Rootfs; got != "/images/app.img" {
		t.Errorf("booted %q, want the image's disk", got)
	}

	plain, err := m.Create(ctx, "key_a", spec())
	if err != nil {
		t.Fatal(err)
	}
	plain = waitState(t, m, "key_a", plain.ID, sandbox.StateRunning)
	if got := e.drv.Machine(plain.ID).Spec().Rootfs; got != "/images/default.img" || plain.ImageID != "" {
		t.Errorf("default create booted %q (image %q), want the default disk", got, plain.ImageID)
	}

	sn, err := m.Snapshots.Snapshot(ctx, "key_a", sb.ID, sandbox.SnapshotSpec{Mode: sandbox.SnapshotModeDisk})
	if err != nil {
		t.Fatal(err)
	}
	if sn.ImageID != "img-1" || sn.Rootfs != "/images/app.img" {
		t.Errorf("snapshot: image %q rootfs %q", sn.ImageID, sn.Rootfs)
	}
	cp, err := m.Create(ctx, "key_a", sandbox.CreateSpec{SnapshotID: sn.ID, TimeoutSeconds: 60, OnLeaseEnd: sandbox.LeaseEndStop})
	if err != nil {
		t.Fatal(err)
	}
	cp = waitState(t, m, "key_a", cp.ID, sandbox.StateRunning)
	if cp.ImageID != "img-1" || e.drv.Machine(cp.ID).Spec().Rootfs != "/images/app.img" {
		t.Errorf("copy: image %q booted %q, want the snapshot's image", cp.ImageID, e.drv.Machine(cp.ID).Spec().Rootfs)
	}
}

type preparer struct {
	name string
	err  error
	mu   sync.Mutex
	seen []string
}

func (p *preparer) Name() string { return p.name }

func (p *preparer) Prepare(ctx context.Context, sb *sandbox.Sandbox, g guest.Handle) error {
	// It really talks to the guest before the sandbox runs.
	res, err := g.Exec(ctx, guest.ExecRequest{Command: "echo prepared"}, nil)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.seen = append(p.seen, sb.ID+":"+string(res.Stdout))
	p.mu.Unlock()
	return p.err
}

// Preparers run before a sandbox is running; one that fails stops it as
// start_failed with an event naming it.
func TestPreparers(t *testing.T) {
	e := newEnv(t)
	ok := &preparer{name: "first"}
	bad := &preparer{name: "volumes"}
	m := e.managerWith(func(cfg *sandbox.Config) { cfg.Preparers = []sandbox.Preparer{ok, bad} })
	ctx := context.Background()

	sb, err := m.Create(ctx, "key_a", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "key_a", sb.ID, sandbox.StateRunning)
	if len(ok.seen) != 1 || ok.seen[0] != sb.ID+":prepared\n" || len(bad.seen) != 1 {
		t.Errorf("preparers saw %q and %q, want one call each, in order", ok.seen, bad.seen)
	}

	bad.err = errors.New("no such volume")
	sb2, err := m.Create(ctx, "key_a", spec())
	if err != nil {
		t.Fatal(err)
	}
	got := waitState(t, m, "key_a", sb2.ID, sandbox.StateStopped)
	if got.StopReason != sandbox.ReasonStartFailed {
		t.Errorf("stop reason %q, want start_failed", got.StopReason)
	}
	if n := countEvents(t, e, sb2.ID, "prepare_failed"); n != 1 {
		t.Errorf("%d prepare_failed events, want 1", n)
	}
	select {
	case <-e.drv.Machine(sb2.ID).Done():
	case <-time.After(10 * time.Second):
		t.Error("the VM of a sandbox whose preparer failed still runs")
	}
}
