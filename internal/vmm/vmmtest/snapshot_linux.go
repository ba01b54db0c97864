package vmmtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/emberbox/emberbox/internal/vmm"
)

// The fake's saved state is a marker file: the guest is the Driver's one
// in-process agent, whose processes and files live on whatever its
// machines do, so a "paused" guest keeps them exactly as a real one keeps
// its memory. The markers live in the sandbox's Dir, so a new manager (a
// restarted server) sees what the last one left.
const (
	savedFile    = "fake-saved"    // in a sandbox Dir: a state Resume can start
	diskFile     = "fake-disk"     // in a sandbox Dir: its disk
	snapshotFile = "fake-snapshot" // in a snapshot dir: what Snapshot wrote
)

// snapshotMeta is the content of snapshotFile.
type snapshotMeta struct {
	ID     string `json:"id"` // the sandbox it was taken of
	Memory bool   `json:"memory"`
}

// FailResumes makes the next n calls of Resume fail before they consume
// the saved state, like a VMM that cannot restore.
func (d *Driver) FailResumes(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failResumes = n
}

// FailPauses makes the next n calls of Pause fail, leaving the
// guest running and nothing saved.
func (d *Driver) FailPauses(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failPauses = n
}

// Resumes reports how many times Resume started a machine.
func (d *Driver) Resumes() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.resumes
}

// Resume implements vmm.Driver.Resume.
func (d *Driver) Resume(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	if !d.Saved(spec) {
		return nil, fmt.Errorf("fake resume of %s: no saved state in %s", spec.ID, spec.Dir)
	}
	d.mu.Lock()
	if d.failResumes > 0 {
		d.failResumes--
		d.mu.Unlock()
		return nil, errors.New("fake resume failed (FailResumes)")
	}
	d.resumes++
	d.mu.Unlock()
	// The state is consumed by Continue, as the contract says.
	return d.start(spec), nil
}

// Saved implements vmm.Driver.Saved.
func (d *Driver) Saved(spec vmm.Spec) bool {
	_, err := os.Stat(filepath.Join(spec.Dir, savedFile))
	return err == nil
}

// Clone implements vmm.Driver.Clone: the copy gets a disk and, for a
// memory snapshot, a saved state.
func (d *Driver) Clone(ctx context.Context, snapDir string, spec vmm.Spec) error {
	b, err := os.ReadFile(filepath.Join(snapDir, snapshotFile))
	if err != nil {
		return fmt.Errorf("fake clone: reading the snapshot: %w", err)
	}
	var meta snapshotMeta
	if err := json.Unmarshal(b, &meta); err != nil {
		return fmt.Errorf("fake clone: %w", err)
	}
	if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
		return fmt.Errorf("fake clone: %w", err)
	}
	if err := os.WriteFile(filepath.Join(spec.Dir, diskFile), b, 0o600); err != nil {
		return fmt.Errorf("fake clone: %w", err)
	}
	if meta.Memory {
		return writeSaved(spec.Dir, spec.ID)
	}
	return nil
}

// Restore implements vmm.Restorer: as Clone, for a memory snapshot only.
// The fake's guest keeps its files and processes whatever happens, so a
// restore here is the bookkeeping alone.
func (d *Driver) Restore(ctx context.Context, snapDir string, spec vmm.Spec) error {
	b, err := os.ReadFile(filepath.Join(snapDir, snapshotFile))
	if err != nil {
		return fmt.Errorf("fake restore: reading the snapshot: %w", err)
	}
	var meta snapshotMeta
	if err := json.Unmarshal(b, &meta); err != nil {
		return fmt.Errorf("fake restore: %w", err)
	}
	if !meta.Memory {
		return errors.New("fake restore: the snapshot holds no memory")
	}
	return d.Clone(ctx, snapDir, spec)
}

func writeSaved(dir, id string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// Written whole, then renamed: Saved never sees half a state.
	tmp := filepath.Join(dir, savedFile+".tmp")
	if err := os.WriteFile(tmp, []byte(id), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, savedFile))
}

// A VM of this driver has every optional ability of a vmm.Machine.
var (
	_ vmm.Pauser           = (*Machine)(nil)
	_ vmm.Snapshotter      = (*Machine)(nil)
	_ vmm.DeltaSnapshotter = (*Machine)(nil)
	_ vmm.Continuer        = (*Machine)(nil)
)

// Pause implements vmm.Pauser: the state is saved and the machine
// ends; the agent's processes and files stay, as a real guest's memory.
func (m *Machine) Pause(ctx context.Context) error {
	m.d.mu.Lock()
	if m.d.failPauses > 0 {
		m.d.failPauses--
		m.d.mu.Unlock()
		return errors.New("fake pause failed (FailPauses)")
	}
	m.d.mu.Unlock()
	if m.dir == "" {
		return errors.New("fake pause: the machine has no Dir")
	}
	if err := writeSaved(m.dir, m.id); err != nil {
		return fmt.Errorf("fake pause: %w", err)
	}
	m.once.Do(func() { close(m.done) })
	return nil
}

// Snapshot implements vmm.Snapshotter.
func (m *Machine) Snapshot(ctx context.Context, dir string, memory bool) (vmm.SnapshotInfo, error) {
	if m.Stopped() {
		return vmm.SnapshotInfo{}, errStopped
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return vmm.SnapshotInfo{}, fmt.Errorf("fake snapshot: %w", err)
	}
	b, _ := json.Marshal(snapshotMeta{ID: m.id, Memory: memory})
	if err := os.WriteFile(filepath.Join(dir, snapshotFile), b, 0o600); err != nil {
		return vmm.SnapshotInfo{}, fmt.Errorf("fake snapshot: %w", err)
	}
	return vmm.SnapshotInfo{Memory: memory, SizeBytes: int64(len(b))}, nil
}

// SnapshotOver implements vmm.DeltaSnapshotter: a memory snapshot that
// says it is a difference over baseDir's whenever baseDir holds one (the
// fake's guest has no memory to compare), so that the bookkeeping of
// bases is exercised.
func (m *Machine) SnapshotOver(ctx context.Context, dir, baseDir string) (vmm.SnapshotInfo, error) {
	info, err := m.Snapshot(ctx, dir, true)
	if err != nil {
		return info, err
	}
	if _, err := os.Stat(filepath.Join(baseDir, snapshotFile)); err == nil {
		info.Base = true
	}
	return info, nil
}

// Continue implements vmm.Continuer: it consumes the saved state
// and counts the call (the fake's guest itself never stops).
func (m *Machine) Continue(ctx context.Context) error {
	if m.Stopped() {
		return errStopped
	}
	if err := os.Remove(filepath.Join(m.dir, savedFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("fake continue: consuming the saved state: %w", err)
	}
	m.d.mu.Lock()
	m.d.continues++
	m.d.mu.Unlock()
	return nil
}

// Continues reports how many times Continue was called.
func (d *Driver) Continues() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.continues
}

// SaveState writes a saved state for sandbox id into dir, as a Pause that
// got as far as saving would, without touching any machine: for tests of
// recovery from a crash in the middle of a pause or wake.
func SaveState(dir, id string) error { return writeSaved(dir, id) }
