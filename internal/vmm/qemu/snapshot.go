package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/vmm"
)

// Pause, snapshots and copies (docs/DESIGN.md, M6 and M7).
//
// Guest RAM is a file in the sandbox's directory that QEMU maps shared, so
// the file always holds the guest's memory. A pause stops the vCPUs, which
// also drains and flushes the disk, has QEMU write the device state alone
// (x-ignore-shared: some 100 KB) to "state", and ends QEMU. A resume
// starts QEMU on the same RAM file and disk, waiting for a migration
// (-incoming defer -S), feeds it "state", and lets the guest run. The
// state is renamed away before the guest runs again: from then on the RAM
// file moves past it, and "state" present always means that the RAM file
// and disk are exactly as the state left them.
//
// A snapshot is the same save into a directory of its own while the guest
// is stopped for a moment: the state, a copy of the RAM file (its holes
// kept) and the disk flattened onto the base image. A copy of a snapshot
// (Clone) gets its own RAM file copied from the snapshot's and a disk
// overlay over the snapshot's disk, and is resumed like a paused sandbox.

// Files of the saved state in a sandbox's or a snapshot's directory.
const (
	stateFile    = "state"          // device state that matches mem and the disk
	stateTmp     = "state.tmp"      // a save in progress
	stateUsed    = "state.restored" // a state being consumed by a resume
	chainFile    = "backing"        // host path of the snapshot disk a copy's disk is over
	snapDiskFile = "disk.qcow2"     // a snapshot's disk, flattened over the base image
	restoreStage = "restore.tmp"    // a checkpoint's files on their way in (Restore)
)

// discardState removes any saved state of dir.
func discardState(dir string) {
	for _, name := range []string{stateFile, stateTmp, stateUsed} {
		_ = os.Remove(filepath.Join(dir, name))
	}
}

// createMem makes a fresh, empty guest RAM file of spec's memory size.
// Holes read as zeros and take no space; the guest fills what it touches.
func createMem(spec vmm.Spec) error {
	name := filepath.Join(spec.Dir, memFile)
	_ = os.Remove(name)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating guest memory file: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(int64(spec.MemoryMiB) << 20); err != nil {
		return fmt.Errorf("sizing guest memory file: %w", err)
	}
	return nil
}

// Saved implements vmm.Driver.Saved.
func (d *Driver) Saved(spec vmm.Spec) bool {
	st, err := os.Stat(filepath.Join(spec.Dir, stateFile))
	return err == nil && st.Mode().IsRegular()
}

// A VM of this driver has every optional ability of a vmm.Machine.
var (
	_ vmm.Pauser           = (*machine)(nil)
	_ vmm.Snapshotter      = (*machine)(nil)
	_ vmm.DeltaSnapshotter = (*machine)(nil)
	_ vmm.Continuer        = (*machine)(nil)
)

// Pause implements vmm.Pauser.
func (m *machine) Pause(ctx context.Context) error {
	select {
	case <-m.exited:
		if m.d.Saved(vmm.Spec{Dir: m.dir}) {
			return nil // a pause that a crash cut short after QEMU quit
		}
		return fmt.Errorf("pausing: %w", vmm.ErrGone)
	default:
	}
	q, err := dialQMP(ctx, m.dir, m.exited)
	if err != nil {
		return fmt.Errorf("pausing: %w", err)
	}
	defer q.Close()
	if err := q.execute(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("pausing: %w", err)
	}
	if err := saveState(ctx, q, m.dir); err != nil {
		// The guest goes on as it was.
		if cerr := q.execute(context.WithoutCancel(ctx), "cont", nil, nil); cerr != nil {
			m.d.log.Error("resuming a guest after a failed pause", "sandbox_id", m.id, "err", cerr)
		}
		return fmt.Errorf("pausing: %w", err)
	}
	// The state is saved and matches the RAM file and the disk: from here
	// the pause has happened, whatever becomes of this QEMU. quit closes
	// the disk cleanly; the connection may end before its answer.
	_ = q.execute(ctx, "quit", nil, nil)
	select {
	case <-m.done:
	case <-time.After(10 * time.Second):
		_ = m.Stop(ctx)
	case <-ctx.Done():
		_ = m.Stop(context.WithoutCancel(ctx))
	}
	// A paused sandbox holds no host memory: its RAM file is written back
	// and dropped from the page cache.
	if err := evict(filepath.Join(m.dir, memFile)); err != nil {
		m.d.log.Warn("dropping a paused guest's memory from the page cache", "sandbox_id", m.id, "err", err)
	}
	return nil
}

// saveState has QEMU (stopped) write its device state into dir/state,
// through a temporary file so that dir/state is always complete.
func saveState(ctx context.Context, q *qmpConn, dir string) error {
	tmp := filepath.Join(dir, stateTmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := q.saveState(ctx, f); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, stateFile)); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// evict writes a file back and drops it from the page cache.
func evict(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return err
	}
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// Resume implements vmm.Driver.Resume.
func (d *Driver) Resume(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	state, err := os.Open(filepath.Join(spec.Dir, stateFile))
	if err != nil {
		return nil, fmt.Errorf("resuming: no saved state: %w", err)
	}
	if st, err := os.Stat(filepath.Join(spec.Dir, memFile)); err != nil || st.Size() != int64(spec.MemoryMiB)<<20 {
		state.Close()
		return nil, fmt.Errorf("resuming: the guest memory file is missing or not %d MiB", spec.MemoryMiB)
	}
	m, err := d.launch(ctx, spec, state)
	state.Close() // QEMU has its own
	if err != nil {
		return nil, fmt.Errorf("resuming: %w", err)
	}
	if err := m.load(ctx); err != nil {
		_ = m.Stop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("resuming: %w", err)
	}
	return m, nil
}

// load has QEMU load the state it inherited; the guest stays stopped.
func (m *machine) load(ctx context.Context) error {
	q, err := dialQMP(ctx, m.dir, m.exited)
	if err != nil {
		return err
	}
	defer q.Close()
	return q.loadState(ctx, stateFD, m.exited)
}

// Continue implements vmm.Continuer: the saved state is renamed
// away (and the directory synced) before the guest runs, as from then on
// the RAM file moves past it.
func (m *machine) Continue(ctx context.Context) error {
	q, err := dialQMP(ctx, m.dir, m.exited)
	if err != nil {
		return fmt.Errorf("continuing: %w", err)
	}
	defer q.Close()
	st, err := q.status(ctx)
	if err != nil {
		return fmt.Errorf("continuing: %w", err)
	}
	if st == "inmigrate" {
		return errors.New("continuing: the guest's state was never loaded")
	}
	used, state := filepath.Join(m.dir, stateUsed), filepath.Join(m.dir, stateFile)
	consumed := false
	if err := os.Rename(state, used); err == nil {
		consumed = true
		if err := syncDir(m.dir); err != nil {
			_ = os.Rename(used, state)
			return fmt.Errorf("continuing: %w", err)
		}
	}
	if err := q.execute(ctx, "cont", nil, nil); err != nil {
		if consumed {
			// The guest has not run: the state still matches.
			_ = os.Rename(used, state)
		}
		return fmt.Errorf("continuing: %w", err)
	}
	discardState(m.dir)
	return nil
}

// Snapshot implements vmm.Snapshotter.
func (m *machine) Snapshot(ctx context.Context, dir string, memory bool) (info vmm.SnapshotInfo, err error) {
	return m.snapshot(ctx, dir, memory, "")
}

// SnapshotOver implements vmm.DeltaSnapshotter: a memory snapshot whose
// RAM is written as the pages that differ from the snapshot in baseDir
// (memdelta.go) when that is small, else whole.
func (m *machine) SnapshotOver(ctx context.Context, dir, baseDir string) (vmm.SnapshotInfo, error) {
	return m.snapshot(ctx, dir, true, baseDir)
}

func (m *machine) snapshot(ctx context.Context, dir string, memory bool, baseDir string) (info vmm.SnapshotInfo, err error) {
	if m.rootfs == "" {
		return info, errors.New("snapshot: the machine does not know its base image")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return info, fmt.Errorf("snapshot: %w", err)
	}
	q, err := dialQMP(ctx, m.dir, m.exited)
	if err != nil {
		return info, fmt.Errorf("snapshot: %w", err)
	}
	defer q.Close()
	if err := q.execute(ctx, "stop", nil, nil); err != nil {
		return info, fmt.Errorf("snapshot: %w", err)
	}
	defer func() {
		// The guest runs on, whatever happened to the copy.
		if cerr := q.execute(context.WithoutCancel(ctx), "cont", nil, nil); cerr != nil && err == nil {
			err = fmt.Errorf("snapshot: resuming the guest: %w", cerr)
		}
	}()
	if memory {
		delta := false
		if baseDir != "" {
			if delta, err = writeMemDelta(filepath.Join(m.dir, memFile), baseDir, dir); err != nil {
				return info, fmt.Errorf("snapshot: writing the memory's difference: %w", err)
			}
		}
		if !delta {
			if err := copySparse(filepath.Join(m.dir, memFile), filepath.Join(dir, memFile), 0o600); err != nil {
				return info, fmt.Errorf("snapshot: copying memory: %w", err)
			}
		}
		info.Base = delta
		if err := copyDevices(m.dir, dir); err != nil {
			return info, fmt.Errorf("snapshot: %w", err)
		}
	}
	// qemu-img runs as root and follows the disk's header, which the VM's
	// uid can write: its chain must be exactly the driver's.
	if err := m.checkChain(); err != nil {
		return info, fmt.Errorf("snapshot: %w", err)
	}
	// Flattened onto the base image, so that the snapshot needs nothing
	// of the sandbox it came from. -U: QEMU holds the disk's lock, and the
	// stop has flushed it.
	out, err := exec.CommandContext(ctx, m.d.cfg.QEMUImg, "convert", "-U", "-f", "qcow2", "-O", "qcow2",
		"-B", m.rootfs, "-F", "raw", filepath.Join(m.dir, diskFile), filepath.Join(dir, snapDiskFile)).CombinedOutput()
	if err != nil {
		return info, fmt.Errorf("snapshot: copying the disk: %v: %s", err, strings.TrimSpace(string(out)))
	}
	// Copies' VMs read the disk as their own uids.
	if err := os.Chmod(filepath.Join(dir, snapDiskFile), 0o644); err != nil {
		return info, fmt.Errorf("snapshot: %w", err)
	}
	if memory {
		// Last: the snapshot has memory once the state is there.
		if err := saveState(ctx, q, dir); err != nil {
			return info, fmt.Errorf("snapshot: saving device state: %w", err)
		}
	}
	info.Memory = memory
	info.SizeBytes = allocated(dir)
	return info, nil
}

// checkChain checks the headers of the machine's disk chain before root
// tools read it: the overlay is over the copy's snapshot disk (the chain
// file names it) or else the base image, and a snapshot disk is over the
// base image; none has an external data file.
func (m *machine) checkChain() error {
	f := hostFiles(vmm.Spec{Dir: m.dir})
	if f.SnapDisk == "" {
		return checkVMQcow2(filepath.Join(m.dir, diskFile), qcow2Backing{Path: m.rootfs, Format: "raw"})
	}
	if err := checkVMQcow2(filepath.Join(m.dir, diskFile), qcow2Backing{Path: f.SnapDisk, Format: "qcow2"}); err != nil {
		return err
	}
	return checkVMQcow2(f.SnapDisk, qcow2Backing{Path: m.rootfs, Format: "raw"})
}

// allocated is the disk space the files in dir take.
func allocated(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(dir, e.Name()), &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

// Clone implements vmm.Driver.Clone.
func (d *Driver) Clone(ctx context.Context, snapDir string, spec vmm.Spec) error {
	snapDisk := filepath.Join(snapDir, snapDiskFile)
	if _, err := os.Stat(snapDisk); err != nil {
		return fmt.Errorf("clone: the snapshot has no disk: %w", err)
	}
	if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
		return fmt.Errorf("clone: %w", err)
	}
	discardState(spec.Dir)
	if err := d.createOverlay(ctx, spec, "", snapDisk, "qcow2"); err != nil {
		return fmt.Errorf("clone: %w", err)
	}
	if err := os.WriteFile(filepath.Join(spec.Dir, chainFile), []byte(snapDisk+"\n"), 0o600); err != nil {
		return fmt.Errorf("clone: %w", err)
	}
	if !d.Saved(vmm.Spec{Dir: snapDir}) {
		return createMem(spec) // a disk snapshot: Start boots it
	}
	if n, err := memSize(snapDir); err != nil || n != int64(spec.MemoryMiB)<<20 {
		return fmt.Errorf("clone: the snapshot's memory is not %d MiB", spec.MemoryMiB)
	}
	if dst := filepath.Join(spec.Dir, memFile); !d.takeSpare(snapDir, dst) {
		if err := copyMem(snapDir, dst); err != nil {
			return fmt.Errorf("clone: copying memory: %w", err)
		}
	}
	if err := copyDevices(snapDir, spec.Dir); err != nil {
		return fmt.Errorf("clone: %w", err)
	}
	// Last, through a temporary name: Saved turns true only when all is there.
	tmp := filepath.Join(spec.Dir, stateTmp)
	if err := copySparse(filepath.Join(snapDir, stateFile), tmp, 0o600); err != nil {
		return fmt.Errorf("clone: copying state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(spec.Dir, stateFile)); err != nil {
		return fmt.Errorf("clone: %w", err)
	}
	return syncDir(spec.Dir)
}

// Restore implements vmm.Restorer: the memory and device state are copied
// as Clone copies them, and the disk, flattened onto the base image in
// the snapshot, is copied whole (its holes kept) instead of overlaid, so
// the sandbox no longer needs the snapshot's files.
func (d *Driver) Restore(ctx context.Context, snapDir string, spec vmm.Spec) error {
	if !d.Saved(vmm.Spec{Dir: snapDir}) {
		return errors.New("restore: the snapshot holds no memory")
	}
	if n, err := memSize(snapDir); err != nil || n != int64(spec.MemoryMiB)<<20 {
		return fmt.Errorf("restore: the snapshot's memory is not %d MiB", spec.MemoryMiB)
	}
	// The snapshot's disk is over the base image the sandbox has now, or
	// the copy would read another image's blocks under its own.
	if err := checkVMQcow2(filepath.Join(snapDir, snapDiskFile), qcow2Backing{Path: spec.Rootfs, Format: "raw"}); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	// Everything is copied aside first, then renamed in with the state
	// last: the sandbox's own saved state is only discarded once the
	// checkpoint's is whole beside it, so a crash leaves one or the other
	// (bar the instant of the renames), never half of each.
	stage := filepath.Join(spec.Dir, restoreStage)
	if err := os.RemoveAll(stage); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if err := os.Mkdir(stage, 0o700); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer os.RemoveAll(stage)
	for _, name := range []string{snapDiskFile, stateFile} {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := copySparse(filepath.Join(snapDir, name), filepath.Join(stage, name), 0o600); err != nil {
			return fmt.Errorf("restore: copying %s: %w", name, err)
		}
	}
	if err := copyMem(snapDir, filepath.Join(stage, memFile)); err != nil {
		return fmt.Errorf("restore: copying memory: %w", err)
	}
	if err := copyDevices(snapDir, stage); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if err := syncDir(stage); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	discardState(spec.Dir)
	if err := os.Remove(filepath.Join(spec.Dir, chainFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("restore: %w", err)
	}
	for _, name := range []string{snapDiskFile, memFile, devicesFile, stateFile} {
		if err := os.Rename(filepath.Join(stage, name), filepath.Join(spec.Dir, name)); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
	}
	return syncDir(spec.Dir)
}

// copySparse copies src to dst (replacing it), keeping src's holes: a guest
// RAM file is mostly holes. A filesystem that can share extents (FICLONE:
// XFS, Btrfs) makes the copy at once; elsewhere the data ranges are copied
// in the kernel with copy_file_range.
func copySparse(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	_ = os.Remove(dst)
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	defer out.Close()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return nil
	}
	size := st.Size()
	if err := out.Truncate(size); err != nil {
		return err
	}
	inFD, outFD := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(inFD, off, unix.SEEK_DATA)
		if err != nil {
			if errors.Is(err, unix.ENXIO) {
				break // only a hole remains
			}
			return err
		}
		hole, err := unix.Seek(inFD, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for data < hole {
			roff, woff := data, data
			n, err := unix.CopyFileRange(inFD, &roff, outFD, &woff, int(hole-data), 0)
			if err != nil {
				if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
					return copyRange(in, out, data, hole-data)
				}
				return err
			}
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
			data += int64(n)
		}
		off = hole
	}
	return nil
}

// copyRange copies n bytes at off from in to out through user space.
func copyRange(in, out *os.File, off, n int64) error {
	_, err := io.Copy(io.NewOffsetWriter(out, off), io.NewSectionReader(in, off, n))
	return err
}
