package vmmtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/emberbox/emberbox/internal/vmm"
)

// A fake paused VM is its saved-state marker and its disk file in its Dir;
// its guest's processes and files live on in the Driver's one agent. So
// managers of two "nodes" (two data dirs) sharing one Driver move a paused
// sandbox as real nodes do: its files go from one Dir to the other, and
// its guest is where it was, as a real guest is in its moved memory.

var _ vmm.Mover = (*Driver)(nil)

// FailMoved makes the next n calls of Moved fail, as a driver that finds
// the moved files unusable.
func (d *Driver) FailMoved(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failMoved = n
}

// MoveFiles implements vmm.Mover.MoveFiles: the saved-state marker and the
// disk.
func (d *Driver) MoveFiles(spec vmm.Spec) (map[string]string, error) {
	if !d.Saved(spec) {
		return nil, fmt.Errorf("fake move: %s holds no saved state", spec.Dir)
	}
	files := map[string]string{savedFile: filepath.Join(spec.Dir, savedFile)}
	if disk := filepath.Join(spec.Dir, diskFile); exists(disk) {
		files[diskFile] = disk
	}
	return files, nil
}

// Moved implements vmm.Mover.Moved: the moved state must be the one saved
// for spec.ID, and nothing may have been left half-saved.
func (d *Driver) Moved(ctx context.Context, spec vmm.Spec) error {
	d.mu.Lock()
	if d.failMoved > 0 {
		d.failMoved--
		d.mu.Unlock()
		return errors.New("fake moved failed (FailMoved)")
	}
	d.mu.Unlock()
	b, err := os.ReadFile(filepath.Join(spec.Dir, savedFile))
	if err != nil {
		return fmt.Errorf("fake moved: %w", err)
	}
	if strings.TrimSpace(string(b)) != spec.ID {
		return fmt.Errorf("fake moved: the saved state is %q's, not %q's", b, spec.ID)
	}
	_ = os.Remove(filepath.Join(spec.Dir, savedFile+".tmp"))
	return nil
}

func exists(name string) bool {
	_, err := os.Stat(name)
	return err == nil
}

var _ vmm.SnapshotMover = (*Driver)(nil)

// SnapshotFiles implements vmm.SnapshotMover.SnapshotFiles: the snapshot's
// marker.
func (d *Driver) SnapshotFiles(dir string) (map[string]string, error) {
	p := filepath.Join(dir, snapshotFile)
	if !exists(p) {
		return nil, fmt.Errorf("fake snapshot files: %s holds no snapshot", dir)
	}
	return map[string]string{snapshotFile: p}, nil
}

// SnapshotMoved implements vmm.SnapshotMover.SnapshotMoved: the marker
// must be of the kind the spec says (memory, or a disk snapshot's when
// MemoryMiB is 0), and a base named must hold one; the spec must name
// what the real driver needs.
func (d *Driver) SnapshotMoved(ctx context.Context, spec vmm.Spec, baseDir string) error {
	if spec.Rootfs == "" || spec.MemoryMiB < 0 || (spec.MemoryMiB == 0 && baseDir != "") {
		return errors.New("fake snapshot moved: the spec names no base image, or a base for no memory")
	}
	for _, dir := range []string{spec.Dir, baseDir} {
		if dir == "" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, snapshotFile))
		if err != nil {
			return fmt.Errorf("fake snapshot moved: %w", err)
		}
		var meta snapshotMeta
		if err := json.Unmarshal(b, &meta); err != nil || meta.Memory != (spec.MemoryMiB > 0) {
			return fmt.Errorf("fake snapshot moved: %s holds no snapshot of the kind the spec says", dir)
		}
	}
	return nil
}
