package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/emberbox/emberbox/internal/vmm"
)

// Moving a paused VM to another node (a drain). The saved state is three
// files, the RAM file, "state" and the overlay disk, and for a copy of a
// snapshot or template a fourth: the snapshot's flattened disk its overlay
// is over, which lives on the old node only and so moves too, under
// movedSnapFile. The base image stays: every node has it at the same path.
// On the new node the disk chain is rebuilt from what is there, never from
// what the files say: the qcow2 headers are rewritten (qemu-img rebase -u,
// which changes only the header) and the chain file written afresh.

var _ vmm.Mover = (*Driver)(nil)

// movedSnapFile is a moved copy's snapshot disk in the sandbox's directory
// (disk.qcow2 there is the sandbox's own overlay).
const movedSnapFile = "backing.qcow2"

// MoveFiles implements vmm.Mover.MoveFiles.
func (d *Driver) MoveFiles(spec vmm.Spec) (map[string]string, error) {
	if !d.Saved(spec) {
		return nil, fmt.Errorf("move: %s holds no saved state", spec.Dir)
	}
	files := map[string]string{}
	for _, name := range []string{memFile, stateFile, diskFile} {
		p := filepath.Join(spec.Dir, name)
		if err := regular(p); err != nil {
			return nil, fmt.Errorf("move: %w", err)
		}
		files[name] = p
	}
	// The device set goes with the state it must be resumed with (a
	// state from before the record has none).
	if p := filepath.Join(spec.Dir, devicesFile); regular(p) == nil {
		files[devicesFile] = p
	}
	if snap := hostFiles(spec).SnapDisk; snap != "" {
		if err := regular(snap); err != nil {
			return nil, fmt.Errorf("move: the snapshot disk of the copy: %w", err)
		}
		files[movedSnapFile] = snap
	}
	return files, nil
}

// Moved implements vmm.Mover.Moved.
func (d *Driver) Moved(ctx context.Context, spec vmm.Spec) error {
	if spec.Rootfs == "" {
		return errors.New("moved: the spec names no base image")
	}
	if err := checkMovedState(spec); err != nil {
		return err
	}
	disk, snap := filepath.Join(spec.Dir, diskFile), filepath.Join(spec.Dir, movedSnapFile)
	chain := filepath.Join(spec.Dir, chainFile)
	hasSnap := false
	switch err := regular(snap); {
	case err == nil:
		hasSnap = true
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("moved: %w", err)
	}
	if err := d.checkQcow2(ctx, disk); err != nil {
		return fmt.Errorf("moved: %w", err)
	}
	if !hasSnap {
		// Whatever chain file came along names a path of another host.
		if err := os.Remove(chain); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("moved: %w", err)
		}
		if err := d.rebase(ctx, disk, spec.Rootfs, "raw"); err != nil {
			return fmt.Errorf("moved: %w", err)
		}
	} else if err := d.rechainSnap(ctx, spec.Rootfs, disk, snap, chain); err != nil {
		return err
	}
	return settleMoved(spec.Dir)
}

// checkMovedState checks that the state files of spec came whole: regular
// files, the memory file of the spec's size.
func checkMovedState(spec vmm.Spec) error {
	for _, name := range []string{memFile, stateFile, diskFile} {
		if err := regular(filepath.Join(spec.Dir, name)); err != nil {
			return fmt.Errorf("moved: %w", err)
		}
	}
	if st, err := os.Stat(filepath.Join(spec.Dir, memFile)); err != nil || st.Size() != int64(spec.MemoryMiB)<<20 {
		return fmt.Errorf("moved: the guest memory file is not %d MiB", spec.MemoryMiB)
	}
	return nil
}

// rechainSnap puts a moved copy's snapshot disk between its disk and the
// base image rootfs, and records the chain.
func (d *Driver) rechainSnap(ctx context.Context, rootfs, disk, snap, chain string) error {
	if err := d.checkQcow2(ctx, snap); err != nil {
		return fmt.Errorf("moved: the snapshot disk: %w", err)
	}
	if err := d.rebase(ctx, snap, rootfs, "raw"); err != nil {
		return fmt.Errorf("moved: %w", err)
	}
	// The VM opens it as its own uid, as it does a snapshot's disk.
	if err := os.Chmod(snap, 0o644); err != nil {
		return fmt.Errorf("moved: %w", err)
	}
	if err := d.rebase(ctx, disk, snap, "qcow2"); err != nil {
		return fmt.Errorf("moved: %w", err)
	}
	tmp := chain + ".tmp"
	if err := os.WriteFile(tmp, []byte(snap+"\n"), 0o600); err != nil {
		return fmt.Errorf("moved: %w", err)
	}
	if err := os.Rename(tmp, chain); err != nil {
		return fmt.Errorf("moved: %w", err)
	}
	return nil
}

// settleMoved makes the moved state files private, drops what a resume
// cut short on the old node left, and syncs dir.
func settleMoved(dir string) error {
	for _, name := range []string{memFile, stateFile, diskFile} {
		if err := os.Chmod(filepath.Join(dir, name), 0o600); err != nil {
			return fmt.Errorf("moved: %w", err)
		}
	}
	// Whatever a resume cut short on the old node left is not the state.
	for _, name := range []string{stateTmp, stateUsed} {
		_ = os.Remove(filepath.Join(dir, name))
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("moved: %w", err)
	}
	return nil
}

// regular checks that name is a regular file itself, not a link to one.
func regular(name string) error {
	st, err := os.Lstat(name)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", name)
	}
	return nil
}

// checkQcow2 checks that name, which came from another host, is a qcow2
// image that keeps its data in itself: an external data file would be a
// path on this host that the header, not the driver, chose. Its backing
// file is rewritten next (rebase -u, which does not open the old one).
func (d *Driver) checkQcow2(_ context.Context, name string) error {
	return checkVMQcow2(name, qcow2Backing{Any: true})
}

// rebase points the header of the qcow2 image name at backing (of format
// fmt) without touching its data: the backing image has the same contents,
// only at another path.
func (d *Driver) rebase(ctx context.Context, name, backing, format string) error {
	out, err := exec.CommandContext(ctx, d.cfg.QEMUImg, "rebase", "-u", "-f", "qcow2",
		"-F", format, "-b", backing, name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("repointing %s at %s: %v: %s", filepath.Base(name), backing, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Moving a snapshot: a checkpoint with its sandbox, or a snapshot to a
// node that makes a copy of it. A memory snapshot is its state, device
// set, flattened disk and memory, whole or as the difference over its
// base; a disk snapshot its disk alone. The base's path is never sent:
// the receiver names it.

var _ vmm.SnapshotMover = (*Driver)(nil)

// SnapshotFiles implements vmm.SnapshotMover.SnapshotFiles.
func (d *Driver) SnapshotFiles(dir string) (map[string]string, error) {
	names := []string{snapDiskFile}
	if d.Saved(vmm.Spec{Dir: dir}) {
		mem := memFile
		if err := regular(filepath.Join(dir, baseFile)); err == nil {
			mem = memDeltaFile
		}
		names = append(names, stateFile, mem)
	}
	files := map[string]string{}
	for _, name := range names {
		p := filepath.Join(dir, name)
		if err := regular(p); err != nil {
			return nil, fmt.Errorf("move: snapshot %s: %w", filepath.Base(dir), err)
		}
		files[name] = p
	}
	if p := filepath.Join(dir, devicesFile); len(names) > 1 && regular(p) == nil {
		files[devicesFile] = p
	}
	return files, nil
}

// SnapshotMoved implements vmm.SnapshotMover.SnapshotMoved.
func (d *Driver) SnapshotMoved(ctx context.Context, spec vmm.Spec, baseDir string) error {
	if spec.Rootfs == "" || spec.MemoryMiB < 0 || (spec.MemoryMiB == 0 && baseDir != "") {
		return errors.New("snapshot moved: the spec names no base image, or a base for no memory")
	}
	if baseDir != "" && !filepath.IsAbs(baseDir) {
		return fmt.Errorf("snapshot moved: base %q is not an absolute path", baseDir)
	}
	// Nothing that names a path, or that the files sent did not include,
	// is kept from the other host.
	for _, name := range []string{baseFile, spareFile, spareTmp, stateTmp, stateUsed, chainFile} {
		_ = os.Remove(filepath.Join(spec.Dir, name))
	}
	modes := map[string]os.FileMode{".": 0o755, snapDiskFile: 0o644}
	if spec.MemoryMiB > 0 {
		mem, err := movedMem(spec, baseDir)
		if err != nil {
			return err
		}
		modes[stateFile], modes[mem] = 0o600, 0o600
	} else {
		for _, name := range []string{stateFile, memFile, memDeltaFile, devicesFile} {
			_ = os.Remove(filepath.Join(spec.Dir, name))
		}
	}
	disk := filepath.Join(spec.Dir, snapDiskFile)
	if err := d.checkQcow2(ctx, disk); err != nil {
		return fmt.Errorf("snapshot moved: %w", err)
	}
	if err := d.rebase(ctx, disk, spec.Rootfs, "raw"); err != nil {
		return fmt.Errorf("snapshot moved: %w", err)
	}
	if baseDir != "" {
		if err := os.WriteFile(filepath.Join(spec.Dir, baseFile), []byte(baseDir+"\n"), 0o600); err != nil {
			return fmt.Errorf("snapshot moved: %w", err)
		}
	}
	// As Snapshot leaves them: copies' VMs read the disk as their own uids.
	for name, mode := range modes {
		if err := os.Chmod(filepath.Join(spec.Dir, name), mode); err != nil {
			return fmt.Errorf("snapshot moved: %w", err)
		}
	}
	return syncDir(spec.Dir)
}

// movedMem checks the memory of a moved memory snapshot (whole, or as a
// difference over the one in baseDir) and its state, and returns the
// memory file's name.
func movedMem(spec vmm.Spec, baseDir string) (string, error) {
	mem, other := memFile, memDeltaFile
	if baseDir != "" {
		mem, other = memDeltaFile, memFile
		if err := sizedMem(filepath.Join(baseDir, memFile), spec.MemoryMiB); err != nil {
			return "", fmt.Errorf("snapshot moved: its base: %w", err)
		}
	}
	_ = os.Remove(filepath.Join(spec.Dir, other))
	if err := sizedMem(filepath.Join(spec.Dir, mem), spec.MemoryMiB); err != nil {
		return "", fmt.Errorf("snapshot moved: %w", err)
	}
	if err := regular(filepath.Join(spec.Dir, stateFile)); err != nil {
		return "", fmt.Errorf("snapshot moved: %w", err)
	}
	return mem, nil
}

// sizedMem checks that name is a regular file of a guest memory of mib MiB.
func sizedMem(name string, mib int) error {
	st, err := os.Lstat(name)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Size() != int64(mib)<<20 {
		return fmt.Errorf("%s is not a guest memory file of %d MiB", filepath.Base(name), mib)
	}
	return nil
}
