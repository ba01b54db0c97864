package vmmtest_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/emberbox/emberbox/internal/vmm"
	"github.com/emberbox/emberbox/internal/vmm/vmmtest"
)

func TestFakePauseResumeClone(t *testing.T) {
	d := vmmtest.NewDriver(t)
	ctx := t.Context()
	spec := vmm.Spec{ID: "sbx_p", Dir: filepath.Join(t.TempDir(), "sbx_p")}
	m, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if d.Saved(spec) {
		t.Fatal("Saved before any pause")
	}
	snapDir := filepath.Join(t.TempDir(), "snap")
	if info, err := vmm.Snapshot(ctx, m, snapDir, true); err != nil || !info.Memory {
		t.Fatalf("Snapshot: %+v, %v", info, err)
	}
	rec := m.Record()
	if err := vmm.Pause(ctx, m); err != nil {
		t.Fatal(err)
	}
	if !d.Saved(spec) {
		t.Fatal("not Saved after Pause")
	}
	if _, err := d.Attach(ctx, spec, rec); !errors.Is(err, vmm.ErrGone) {
		t.Errorf("Attach to a paused machine: %v, want ErrGone", err)
	}
	d.FailResumes(1)
	if _, err := d.Resume(ctx, spec); err == nil || !d.Saved(spec) {
		t.Fatalf("a failed Resume: %v, Saved %v; want an error and the state kept", err, d.Saved(spec))
	}
	m2, err := d.Resume(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Saved(spec) {
		t.Error("Resume consumed the state: only Continue may")
	}
	if err := vmm.Continue(ctx, m2); err != nil || d.Continues() != 1 {
		t.Errorf("Continue: %v, %d calls", err, d.Continues())
	}
	if d.Saved(spec) {
		t.Error("Saved after Continue: the state must be consumed")
	}
	if _, err := d.Resume(ctx, spec); err == nil {
		t.Error("a second Resume of one saved state worked")
	}

	cp := vmm.Spec{ID: "sbx_c", Dir: filepath.Join(t.TempDir(), "sbx_c")}
	if err := d.Clone(ctx, snapDir, cp); err != nil {
		t.Fatal(err)
	}
	if !d.Saved(cp) {
		t.Fatal("a memory snapshot's clone is not Saved")
	}
	if _, err := d.Resume(ctx, cp); err != nil {
		t.Fatal(err)
	}
	diskSnap := filepath.Join(t.TempDir(), "disk")
	if _, err := vmm.Snapshot(ctx, m2, diskSnap, false); err != nil {
		t.Fatal(err)
	}
	dc := vmm.Spec{ID: "sbx_d", Dir: filepath.Join(t.TempDir(), "sbx_d"), KeepDisk: true}
	if err := d.Clone(ctx, diskSnap, dc); err != nil || d.Saved(dc) {
		t.Fatalf("a disk snapshot's clone: %v, Saved %v", err, d.Saved(dc))
	}
	if _, err := d.Start(ctx, dc); err != nil {
		t.Errorf("Start with KeepDisk of a clone: %v", err)
	}
	if _, err := d.Start(ctx, vmm.Spec{ID: "sbx_x", Dir: filepath.Join(t.TempDir(), "x"), KeepDisk: true}); err == nil {
		t.Error("Start with KeepDisk and no disk worked")
	}
}
