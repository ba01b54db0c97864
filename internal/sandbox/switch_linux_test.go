package sandbox_test

import (
	"context"
	"testing"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// TestSwitchImageRefusals: an image whose disk is larger than the
// sandbox's, and another key's sandbox, are refused before anything
// changes.
func TestSwitchImageRefusals(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	sb, err := m.Create(ctx, "key_a", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "key_a", sb.ID, sandbox.StateRunning)
	big := &sandbox.ImageRef{ID: "img_big", Rootfs: "/nonexistent/rootfs.img", MinDiskMiB: 8192}
	if _, err := m.Switcher.SwitchImage(ctx, "key_a", sb.ID, big); errdefs.Code(err) != "invalid_request" {
		t.Errorf("switch to an image larger than the disk: %v, want invalid_request", err)
	}
	if _, err := m.Switcher.SwitchImage(ctx, "key_b", sb.ID, nil); !errdefs.IsNotFound(err) {
		t.Errorf("switch of another key's sandbox: %v, want not found", err)
	}
	got, err := m.Get(ctx, "key_a", sb.ID)
	if err != nil || got.State != sandbox.StateRunning || got.ImageID != "" {
		t.Errorf("after refused switches: %+v, %v", got, err)
	}
	if _, err := m.Delete(ctx, "key_a", sb.ID); err != nil {
		t.Fatal(err)
	}
}
