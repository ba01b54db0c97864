package vmmtest_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/emberbox/emberbox/internal/vmm"
	"github.com/emberbox/emberbox/internal/vmm/vmmtest"
)

func TestFakeMove(t *testing.T) {
	d := vmmtest.NewDriver(t)
	ctx := t.Context()
	spec := vmm.Spec{ID: "sbx_m", Dir: filepath.Join(t.TempDir(), "sbx_m")}
	m, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.MoveFiles(spec); err == nil {
		t.Error("MoveFiles of a running machine succeeded")
	}
	if err := vmm.Pause(ctx, m); err != nil {
		t.Fatal(err)
	}
	files, err := d.MoveFiles(spec)
	if err != nil || len(files) != 2 {
		t.Fatalf("MoveFiles = %v, %v; want the saved state and the disk", files, err)
	}
	moved := spec
	moved.Dir = filepath.Join(t.TempDir(), "sbx_m")
	if err := os.MkdirAll(moved.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(moved.Dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	other := moved
	other.ID = "sbx_other"
	if err := d.Moved(ctx, other); err == nil {
		t.Error("Moved accepted another sandbox's state")
	}
	if err := d.Moved(ctx, moved); err != nil || !d.Saved(moved) {
		t.Fatalf("Moved: %v, Saved %v", err, d.Saved(moved))
	}
	r, err := d.Resume(ctx, moved)
	if err != nil {
		t.Fatal(err)
	}
	if err := vmm.Continue(ctx, r); err != nil || d.Saved(moved) {
		t.Fatalf("Continue of the moved machine: %v, Saved %v", err, d.Saved(moved))
	}
	c, err := r.DialGuest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
