package vmm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// Spec describes a VM to boot.
type Spec struct {
	ID        string // sandbox id, for logs and process identification
	Dir       string // the sandbox's own directory: disk overlay, sockets, logs
	VCPU      int
	MemoryMiB int
	DiskMiB   int // the guest disk's size; the overlay is capped at it

	Kernel string // kernel image
	Initrd string // initramfs with the agent as /init
	Rootfs string // shared read-only base disk image (raw)
	// Layer is the computer-use layer (raw, read-only, one file for all
	// VMs), attached as a second disk; "" attaches none.
	Layer      string
	KernelArgs []string // extra kernel command-line arguments

	// KeepDisk makes Start boot from the disk already in Dir (a restart of
	// a stopped sandbox) instead of a fresh overlay of Rootfs.
	KeepDisk bool
}

// ErrGone is returned by Attach when the VM no longer runs.
var ErrGone = errors.New("vm is gone")

// Driver boots VMs of one kind.
type Driver interface {
	// Name identifies the driver ("qemu", "firecracker").
	Name() string
	// Accel reports the acceleration new VMs get ("kvm" or "tcg").
	Accel() string
	// Start boots a VM. It returns once the VMM process runs; the guest
	// may still be booting (see Machine.DialGuest).
	Start(ctx context.Context, spec Spec) (Machine, error)
	// Attach finds a VM started earlier, possibly by another process of
	// the server, from the record Machine.Record returned. It returns
	// ErrGone if that VM no longer runs.
	Attach(ctx context.Context, spec Spec, record []byte) (Machine, error)

	// Resume starts the VM whose state a Pause saved in spec.Dir, or that
	// Clone prepared there, with that state loaded and the guest not yet
	// running: the caller records the machine, then lets the guest go on
	// with Continue (Continuer), which consumes the state. So a crash between
	// the two leaves a VM that never ran and a state that still matches
	// (Saved is true): the VM can be ended and the state resumed again.
	Resume(ctx context.Context, spec Spec) (Machine, error)
	// Saved reports whether spec.Dir holds a complete saved state that
	// Resume can start (written by Pause or Clone, not yet consumed).
	Saved(spec Spec) bool
	// Clone prepares spec.Dir as a copy of the snapshot in snapDir (made
	// by Snapshot): its own disk over the snapshot's and, when the
	// snapshot has memory, its own copy of that memory and device state,
	// so that Saved is true and Resume starts it. A snapshot without
	// memory leaves only the disk; Start with KeepDisk boots it.
	Clone(ctx context.Context, snapDir string, spec Spec) error
}

// SnapshotInfo describes what a Snapshotter wrote.
type SnapshotInfo struct {
	Memory    bool  // it holds memory and device state, not only the disk
	SizeBytes int64 // bytes allocated on the host's disk
	// Base: its memory is a difference over the snapshot it was asked to
	// be taken over (DeltaSnapshotter), whose files it needs as long as
	// it exists; false, it is whole.
	Base bool
}

// Usage is what the host's kernel has accounted to one VM since its VMM
// process started: measured outside the guest, so the guest cannot change it.
type Usage struct {
	// CPU is the user and system CPU time of the VMM, all its threads
	// (vCPUs, device emulation, I/O) together.
	CPU time.Duration
	// RSSBytes is the VMM's resident memory now; 0 once it has exited.
	RSSBytes int64
	// Final: the VMM has exited and CPU is its last count.
	Final bool
}

// Machine is one running VM.
type Machine interface {
	// Record is what Attach needs to find this VM again; the caller
	// persists it.
	Record() []byte
	// Accel reports whether this VM runs under "kvm" or "tcg".
	Accel() string
	// PID is the VMM process id.
	PID() int
	// Usage reads the VM's CPU and memory from the host's accounting.
	// After Done it answers the VMM's final counters (Final set), so that
	// nothing it used between the last reading and its end is lost.
	Usage() (Usage, error)
	// DialGuest connects to the guest agent's stream. Only one connection
	// is served at a time.
	DialGuest(ctx context.Context) (net.Conn, error)
	// Stop ends the VM, gracefully if it can within ctx, and waits for
	// the VMM process to exit.
	Stop(ctx context.Context) error
	// Done is closed when the VMM process has exited.
	Done() <-chan struct{}
}

// The optional abilities of a Machine, each its own interface found by
// type assertion (as io.Copy finds an io.WriterTo): a driver that cannot
// pause, snapshot or continue a VM leaves the method out, and the
// functions Pause, Snapshot and Continue answer errors.ErrUnsupported.

// Pauser is a Machine that can pause.
type Pauser interface {
	// Pause stops the guest, saves its device state in its Dir beside its
	// memory and disk, all consistent with one another, and ends the VMM:
	// afterwards the VM holds no host memory or CPU, and Driver.Resume
	// continues it. Called again on a reattached machine whose pause was
	// cut short, it finishes the pause.
	Pause(ctx context.Context) error
}

// Snapshotter is a Machine that can copy its guest while it runs.
type Snapshotter interface {
	// Snapshot saves a consistent copy of the guest into dir (created by
	// the call): the disk always, and memory with device state when
	// memory is true. The guest is stopped for the copy and runs on after.
	Snapshot(ctx context.Context, dir string, memory bool) (SnapshotInfo, error)
}

// DeltaSnapshotter is a Snapshotter that can write a memory snapshot as
// its difference from an earlier memory snapshot of the same guest.
type DeltaSnapshotter interface {
	// SnapshotOver saves a memory snapshot into dir as Snapshot does,
	// its memory as what differs from the snapshot in baseDir where that
	// is small (Base set in the answer: dir needs baseDir's files for as
	// long as it exists, and baseDir never changes), else whole. Clone
	// and Restore read either.
	SnapshotOver(ctx context.Context, dir, baseDir string) (SnapshotInfo, error)
}

// SnapshotOver saves a memory snapshot of m into dir, over the one in
// baseDir where m can (see DeltaSnapshotter), else whole.
func SnapshotOver(ctx context.Context, m Machine, dir, baseDir string) (SnapshotInfo, error) {
	if d, ok := m.(DeltaSnapshotter); ok && baseDir != "" {
		return d.SnapshotOver(ctx, dir, baseDir)
	}
	return Snapshot(ctx, m, dir, true)
}

// OOMScorer is a Machine whose VMM process's standing with the host
// kernel's OOM killer can be set, so that if the host ever runs out of
// memory the VMs that matter least are ended first.
type OOMScorer interface {
	// SetOOMScore sets the VMM process's oom_score_adj (-1000 to 1000).
	SetOOMScore(adj int) error
}

// Continuer is a Machine that Driver.Resume returned, or one a crash left
// stopped, that can let its guest run on.
type Continuer interface {
	// Continue lets the guest of a machine that Resume returned run,
	// consuming the saved state first (afterwards Saved is false): the
	// guest goes on where it stopped, with its memory, processes and disk;
	// its agent connection is a new one. It also lets run a guest that a
	// crash of the server left stopped with no saved state (recovery of a
	// pause or wake cut short). It is safe to repeat.
	Continue(ctx context.Context) error
}

// Pause pauses m (see Pauser).
func Pause(ctx context.Context, m Machine) error {
	p, ok := m.(Pauser)
	if !ok {
		return fmt.Errorf("pausing a VM: %w", errors.ErrUnsupported)
	}
	return p.Pause(ctx)
}

// Snapshot copies m's guest into dir (see Snapshotter).
func Snapshot(ctx context.Context, m Machine, dir string, memory bool) (SnapshotInfo, error) {
	s, ok := m.(Snapshotter)
	if !ok {
		return SnapshotInfo{}, fmt.Errorf("snapshotting a VM: %w", errors.ErrUnsupported)
	}
	return s.Snapshot(ctx, dir, memory)
}

// Restorer is a Driver that can put a sandbox back to a memory snapshot
// of its own, as a checkpoint's restore does.
type Restorer interface {
	// Restore prepares spec.Dir, whose VM is not running, as the snapshot
	// in snapDir was: its memory, device state and disk, so that Saved is
	// true and Resume goes on from there. Unlike Clone's, the disk is the
	// sandbox's own copy and needs nothing of the snapshot afterwards, so
	// the snapshot can be deleted while the sandbox runs on.
	Restore(ctx context.Context, snapDir string, spec Spec) error
}

// Restore puts the sandbox of spec back to the snapshot in snapDir (see
// Restorer).
func Restore(ctx context.Context, d Driver, snapDir string, spec Spec) error {
	r, ok := d.(Restorer)
	if !ok {
		return fmt.Errorf("restoring a snapshot: %w", errors.ErrUnsupported)
	}
	return r.Restore(ctx, snapDir, spec)
}

// Continue lets m's guest run on (see Continuer).
func Continue(ctx context.Context, m Machine) error {
	c, ok := m.(Continuer)
	if !ok {
		return fmt.Errorf("continuing a VM: %w", errors.ErrUnsupported)
	}
	return c.Continue(ctx)
}

// StrayKiller is implemented by drivers that can find and end a VM of a
// sandbox that no record names: one started by a boot that a crash of the
// server interrupted before its record was saved.
type StrayKiller interface {
	// KillStray ends every VM of spec.ID and reports how many it ended.
	KillStray(ctx context.Context, spec Spec) (int, error)
}

// DiskExporter is implemented by drivers that can write a snapshot's disk
// (made by Snapshot in snapDir) out as a raw disk image: the
// image builder turns a build's last snapshot into a root disk. The
// driver owns its disk formats, so the conversion is its job.
type DiskExporter interface {
	// ExportDisk writes the whole disk of the snapshot in snapDir, its
	// base image included, to dst as a raw image (sparse where it reads
	// zeros), mode 0644.
	ExportDisk(ctx context.Context, snapDir, dst string) error
}

// SpareKeeper is implemented by drivers that can make the copies Clone
// needs of a memory snapshot ahead of time: the manager has its templates
// kept warm, so that a create does not wait for a copy of guest memory.
type SpareKeeper interface {
	// KeepSpare keeps a copy of the memory of the snapshot in snapDir
	// ready for the next Clone of it, and another after each Clone, from
	// now on. The snapshot must not change while kept.
	KeepSpare(snapDir string)
}

// Mover is implemented by drivers whose paused VMs can move to another
// host's data dir (a node of a cluster being drained).
type Mover interface {
	// MoveFiles names the files that hold the paused VM saved in spec.Dir,
	// by the name each takes in the directory it moves to (plain names, no
	// slashes), each mapped to its host path now. The VM's base image
	// (spec.Rootfs) is not among them: every node has it at the same path.
	// The disk a copy of a snapshot or template is over (a node-local
	// snapshot's disk) is among them, so the moved VM depends on nothing
	// of the old node's.
	MoveFiles(spec Spec) (map[string]string, error)
	// Moved makes the files MoveFiles named, now in spec.Dir, resumable
	// there: it checks them and repoints the disk chain at the moved
	// copies and spec.Rootfs, so that Saved(spec) is true and Resume
	// starts the VM. The files came from another host: nothing in them
	// may name a host path that Moved does not set itself.
	Moved(ctx context.Context, spec Spec) error
}

// SnapshotMover is a Mover that can also move a snapshot's files, so that
// a sandbox's checkpoints go with it to another node and a node can copy
// a snapshot another node holds.
type SnapshotMover interface {
	// SnapshotFiles names the files that hold the snapshot in dir, as
	// MoveFiles names a paused VM's: plain names mapped to host paths. A
	// snapshot whose memory is a difference over a base names the
	// difference alone; the base moves as a snapshot of its own.
	SnapshotFiles(dir string) (map[string]string, error)
	// SnapshotMoved makes the files SnapshotFiles named, now in spec.Dir,
	// a snapshot here: it checks them against spec.MemoryMiB (0: a disk
	// snapshot, which holds no memory) and repoints the disk at
	// spec.Rootfs. baseDir is the directory here of the snapshot its
	// memory is a difference over ("" if it is whole). The files came
	// from another host: nothing in them may name a host path.
	SnapshotMoved(ctx context.Context, spec Spec, baseDir string) error
}
