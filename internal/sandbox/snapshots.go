package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/metering"
	"github.com/emberbox/emberbox/internal/vmm"
)

// SnapshotStore is what snapshots need from the store beyond Store;
// store.Store implements it.
type SnapshotStore interface {
	InsertSnapshot(ctx context.Context, sn *Snapshot) error
	GetSnapshot(ctx context.Context, id string) (*Snapshot, error)
	UpdateSnapshot(ctx context.Context, id string, fn func(sn *Snapshot) bool) (*Snapshot, error)
	ListSnapshots(ctx context.Context, opts SnapshotListOptions) ([]*Snapshot, string, error)
	// ExpiredSnapshots lists the snapshots, not deleted, whose retention
	// ended by now.
	ExpiredSnapshots(ctx context.Context, now time.Time) ([]*Snapshot, error)
	// UnusedDeletedSnapshots lists the deleted snapshots whose files are
	// still there and that no sandbox but a deleted one was made from.
	UnusedDeletedSnapshots(ctx context.Context) ([]string, error)
}

// captureTimeout bounds one vmm.Snapshot.
const captureTimeout = 10 * time.Minute

// SnapshotSpec is a validated snapshot request.
type SnapshotSpec struct {
	Name          string
	Labels        map[string]string
	RetentionDays int    // 0: DefaultSnapshotRetentionDays
	Mode          string // SnapshotModeMemory (default) or SnapshotModeDisk
	// checkpointOf makes it a checkpoint of that sandbox (checkpoints.go).
	checkpointOf string
	// base, if set, is an earlier whole memory snapshot of the same
	// sandbox that this one's memory may be written as a difference over.
	base *Snapshot
}

// SnapshotUpdate changes a snapshot's name and labels; nil fields stay.
type SnapshotUpdate struct {
	Name   *string // "" clears it
	Labels map[string]string
	// IfLabels, when not nil, must equal the labels the snapshot has, or
	// the update is refused (labels_changed): a fence against a
	// concurrent change.
	IfLabels map[string]string
}

// Snapshots takes, keeps and expires the snapshots of sandboxes. It
// drives the sandboxes through snapshotHost; Manager.Snapshots returns the
// manager's.
type Snapshots struct {
	host        snapshotHost
	records     Store      // a SnapshotStore, or this server keeps no snapshots
	charges     MeterStore // a deleted snapshot is charged up to its deletion
	driver      vmm.Driver
	dataDir     string        // snapshots live in dataDir/snapshots/<id>
	bootTimeout time.Duration // how long a sandbox starting may take to run
	log         *slog.Logger
	volumes     volumeHooks // refuse snapshots of sandboxes holding volumes
	outcomes    outcomes
	link        guestLink       // detaches a guest whose memory is captured
	ctx         context.Context // the manager's: ends at its Close
	copied      func(src, dst string)
	files       sandboxFiles // the default image, for a snapshot of it
	fetch       SnapshotFetcher
	fetching    singleflight.Group // one fetch of a snapshot at a time
	pinMu       sync.Mutex
	pins        map[string]int // snapshots creates are making copies of
}

// snapshotHost is what snapshots need of the manager: a sandbox as its
// owner sees it, brought to running and paused again, its VM lock and
// instance for a capture, its events and the clock.
type snapshotHost interface {
	Get(ctx context.Context, owner, id string) (*Sandbox, error)
	WaitFor(ctx context.Context, owner, id string, states ...State) (*Sandbox, error)
	Wake(ctx context.Context, owner, id string, timeout *int) (*Sandbox, error)
	pause(ctx context.Context, id, why string) (*Sandbox, error)
	lockOp(id string) (unlock func())
	liveInstance(id string) *instance
	event(id, typ, msg string, data map[string]any)
	now() time.Time
	// Create and delete make and undo the copies of a fork or a branch.
	Create(ctx context.Context, owner string, spec CreateSpec) (*Sandbox, error)
	delete(ctx context.Context, id, reason string) (*Sandbox, error)
}

func newSnapshots(m *Manager) *Snapshots {
	return &Snapshots{host: m, records: m.cfg.Store, charges: m.cfg.Meter, driver: m.cfg.Driver, copied: m.cfg.Copied,
		dataDir: m.cfg.DataDir, bootTimeout: m.cfg.BootTimeout, log: m.log,
		volumes: m.volumes, outcomes: m.outcomes, link: m.link, ctx: m.ctx, files: m.files, fetch: m.cfg.FetchSnapshot}
}

func (sp *Snapshots) store() (SnapshotStore, error) {
	ss, ok := sp.records.(SnapshotStore)
	if !ok {
		return nil, errdefs.New(errdefs.ErrUnavailable, "snapshots_unavailable", "this server's store keeps no snapshots")
	}
	return ss, nil
}

func (sp *Snapshots) dir(id string) string {
	return filepath.Join(sp.dataDir, "snapshots", id)
}

func snapshotNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "snapshot_not_found", "no snapshot %q", id)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// randomUUID returns a random (version 4) UUID.
func randomUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// getSnapshot loads a snapshot of owner's that is not deleted.
func (sp *Snapshots) getSnapshot(ctx context.Context, owner, id string) (*Snapshot, error) {
	ss, err := sp.store()
	if err != nil {
		return nil, err
	}
	sn, err := ss.GetSnapshot(ctx, id)
	if errdefs.IsNotFound(err) || (err == nil && (sn.OwnerKeyID != owner || sn.State == SnapshotDeleted)) {
		return nil, snapshotNotFound(id)
	}
	return sn, err
}

// GetSnapshot implements api.Manager.GetSnapshot.
func (sp *Snapshots) GetSnapshot(ctx context.Context, owner, id string) (*Snapshot, error) {
	return sp.getSnapshot(ctx, owner, id)
}

// ListSnapshots implements api.Manager.ListSnapshots.
func (sp *Snapshots) ListSnapshots(ctx context.Context, opts SnapshotListOptions) ([]*Snapshot, string, error) {
	ss, err := sp.store()
	if err != nil {
		return nil, "", err
	}
	if opts.OwnerKeyID == "" {
		return nil, "", errdefs.New(errdefs.ErrInternal, "internal", "listing snapshots without an owner")
	}
	return ss.ListSnapshots(ctx, opts)
}

// Snapshot implements api.Manager.Snapshot: a consistent copy of the
// sandbox (memory and disk, or the disk alone) kept in
// DataDir/snapshots/<id> for the retention. The guest is stopped for the
// copy and runs on after; a paused sandbox is woken for it and paused
// again. It answers once the capture is over, ready or failed.
func (sp *Snapshots) Snapshot(ctx context.Context, owner, id string, spec SnapshotSpec) (_ *Snapshot, err error) {
	defer func() { sp.outcomes.op("snapshot", err) }()
	_, capture, err := sp.begin(ctx, owner, id, spec)
	if err != nil {
		return nil, err
	}
	return capture(context.WithoutCancel(ctx))
}

// begin checks a snapshot of sandbox id, wakes it if it is paused and
// records the snapshot capturing; capture then takes it and answers it
// ready or failed. Between the two nothing of the sandbox is locked:
// capture may run in the background, as a checkpoint's does.
func (sp *Snapshots) begin(ctx context.Context, owner, id string, spec SnapshotSpec) (*Snapshot, func(context.Context) (*Snapshot, error), error) {
	ss, err := sp.store()
	if err != nil {
		return nil, nil, err
	}
	sb, err := sp.settleRunning(ctx, owner, id)
	if err != nil {
		return nil, nil, err
	}
	if err := sp.volumes.refuse(ctx, sb.ID); err != nil {
		return nil, nil, err
	}
	repause := sb.State == StatePaused
	if repause {
		if _, err := sp.host.Wake(ctx, owner, id, nil); err != nil {
			return nil, nil, err
		}
		if sb, err = sp.settleRunning(ctx, owner, id); err != nil {
			return nil, nil, err
		}
		if sb.State != StateRunning {
			return nil, nil, Refusal(sb)
		}
	}
	if spec.Mode == "" {
		spec.Mode = SnapshotModeMemory
	}
	if spec.RetentionDays == 0 {
		spec.RetentionDays = DefaultSnapshotRetentionDays
	}
	now := sp.host.now()
	expires := now.Add(time.Duration(spec.RetentionDays) * 24 * time.Hour)
	sn := &Snapshot{ID: "snap_" + randomHex(10), OwnerKeyID: owner, Name: spec.Name, Labels: spec.Labels,
		SourceSandboxID: id, Mode: spec.Mode, State: SnapshotCapturing, VCPU: sb.VCPU, MemoryMiB: sb.MemoryMiB,
		DiskMiB: sb.DiskMiB, RetentionDays: spec.RetentionDays, CreatedAt: now, ExpiresAt: &expires,
		ImageID: sb.ImageID, Rootfs: sb.Rootfs}
	kind := "snapshot"
	if spec.checkpointOf != "" {
		// A checkpoint lives as long as its sandbox, within its bounds.
		kind = "checkpoint"
		sn.ID, sn.CheckpointOf, sn.RetentionDays, sn.ExpiresAt = "ckpt_"+randomHex(10), spec.checkpointOf, 0, nil
	}
	baseDir := ""
	if spec.base != nil && sn.Mode == SnapshotModeMemory {
		// Recorded before the capture reads the base: its files stay
		// from now on (UnusedDeletedSnapshots), until the capture says
		// whether it needs them.
		sn.BaseID, baseDir = spec.base.ID, sp.dir(spec.base.ID)
	}
	if err := ss.InsertSnapshot(ctx, sn); err != nil {
		return nil, nil, err
	}
	capture := func(ctx context.Context) (*Snapshot, error) {
		return sp.finish(ctx, sn, kind, baseDir, repause)
	}
	return sn, capture, nil
}

// finish takes the snapshot begin recorded (kind "snapshot" or
// "checkpoint"; over baseDir's memory where it can), pauses its sandbox
// again if begin woke it, and records it ready or failed.
func (sp *Snapshots) finish(ctx context.Context, sn *Snapshot, kind, baseDir string, repause bool) (*Snapshot, error) {
	id := sn.SourceSandboxID
	ss, err := sp.store()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	info, capErr := sp.capture(id, sp.dir(sn.ID), sn.Mode == SnapshotModeMemory, baseDir)
	took := time.Since(start)
	if repause {
		if _, err := sp.host.pause(ctx, id, "snapshot"); err != nil {
			sp.log.Warn("pausing again after a snapshot", "sandbox_id", id, "err", err)
		}
	}
	readyAt := sp.host.now()
	got, err := ss.UpdateSnapshot(ctx, sn.ID, func(s *Snapshot) bool {
		if s.State != SnapshotCapturing {
			return false // deleted meanwhile
		}
		if capErr != nil {
			// Its files go below: it holds no base's any more.
			s.State, s.Error = SnapshotFailed, "capture failed: the sandbox stopped or its VMM could not save it"
			s.BaseID, s.FilesRemovedAt = "", &readyAt
			return true
		}
		s.State, s.ReadyAt, s.SizeBytes = SnapshotReady, &readyAt, info.SizeBytes
		if !info.Base {
			s.BaseID = "" // written whole
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	if capErr != nil {
		sp.log.Warn(kind+" capture failed", "sandbox_id", id, "snapshot_id", got.ID, "err", capErr)
		_ = os.RemoveAll(sp.dir(got.ID))
		sp.host.event(id, kind+"_failed", kind+" capture failed", map[string]any{kind + "Id": got.ID})
	} else {
		sp.host.event(id, kind, kind+" taken", map[string]any{kind + "Id": got.ID, "mode": got.Mode,
			"sizeBytes": got.SizeBytes, "captureMs": took.Milliseconds(), "baseId": got.BaseID})
	}
	return got, nil
}

// FailInterrupted records failed the snapshots and checkpoints of this
// node still capturing when the server starts: a capture a crash or a
// stop cut short is not whole, so it is not kept (its files are removed).
func (sp *Snapshots) FailInterrupted(ctx context.Context) {
	ss, err := sp.store()
	if err != nil {
		return
	}
	cs, ok := ss.(interface {
		CapturingSnapshots(ctx context.Context) ([]string, error)
	})
	if !ok {
		return
	}
	ids, err := cs.CapturingSnapshots(ctx)
	if err != nil {
		sp.log.Error("listing interrupted captures", "err", err)
		return
	}
	for _, id := range ids {
		_ = os.RemoveAll(sp.dir(id))
		if _, err := ss.UpdateSnapshot(ctx, id, func(s *Snapshot) bool {
			if s.State != SnapshotCapturing {
				return false
			}
			now := sp.host.now()
			s.State, s.Error = SnapshotFailed, "capture cut short by a stop of the server"
			s.BaseID, s.FilesRemovedAt = "", &now
			return true
		}); err != nil {
			sp.log.Error("recording an interrupted capture failed", "snapshot_id", id, "err", err)
			continue
		}
		sp.log.Warn("a capture was cut short by a stop of the server; recorded failed", "snapshot_id", id)
	}
}

// settleRunning returns the sandbox once it is not starting, resuming or
// pausing (waiting at most a boot's time), or its refusal if it cannot run.
func (sp *Snapshots) settleRunning(ctx context.Context, owner, id string) (*Sandbox, error) {
	sb, err := sp.host.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sb.State == StateStarting || sb.State == StateResuming || sb.State == StatePausing {
		wctx, cancel := context.WithTimeout(ctx, pauseTimeout+sp.bootTimeout)
		sb, err = sp.host.WaitFor(wctx, owner, id, StateRunning, StatePaused)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	if sb.State != StateRunning && sb.State != StatePaused {
		return nil, Refusal(sb)
	}
	return sb, nil
}

// capture has the sandbox's VM write a snapshot (with memory, or the disk
// alone) into dir, under its VM lock so that no pause or stop replaces the
// VM meanwhile; with a baseDir, its memory as a difference over that
// snapshot's where the driver can and it is small.
func (sp *Snapshots) capture(id, dir string, memory bool, baseDir string) (vmm.SnapshotInfo, error) {
	unlock := sp.host.lockOp(id)
	defer unlock()
	in := sp.host.liveInstance(id)
	if in == nil {
		return vmm.SnapshotInfo{}, fmt.Errorf("sandbox %s has no vm", id)
	}
	mach := in.vm()
	if mach == nil {
		return vmm.SnapshotInfo{}, fmt.Errorf("sandbox %s has no vm", id)
	}
	ctx, cancel := context.WithTimeout(sp.ctx, captureTimeout)
	defer cancel()
	if memory {
		// Copies must find the agent waiting for a new connection.
		in.saving.Lock()
		defer in.saving.Unlock()
		sp.link.detach(ctx, in)
	}
	if memory && baseDir != "" {
		return vmm.SnapshotOver(ctx, mach, dir, baseDir)
	}
	return vmm.Snapshot(ctx, mach, dir, memory)
}

// UpdateSnapshot implements api.Manager.UpdateSnapshot.
func (sp *Snapshots) UpdateSnapshot(ctx context.Context, owner, id string, u SnapshotUpdate) (*Snapshot, error) {
	if _, err := sp.getSnapshot(ctx, owner, id); err != nil {
		return nil, err
	}
	ss, _ := sp.store()
	fenced := false
	sn, err := ss.UpdateSnapshot(ctx, id, func(s *Snapshot) bool {
		if s.State == SnapshotDeleted {
			return false
		}
		if u.IfLabels != nil && !sameLabels(s.Labels, u.IfLabels) {
			fenced = true
			return false
		}
		if u.Name != nil {
			s.Name = *u.Name
		}
		if u.Labels != nil {
			s.Labels = u.Labels
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	if fenced {
		return nil, errdefs.New(errdefs.ErrConflict, "labels_changed", "the snapshot's labels are not ifLabels").
			WithHint("read it again and retry with its current labels")
	}
	if sn.State == SnapshotDeleted {
		return nil, snapshotNotFound(id)
	}
	return sn, nil
}

func sameLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// ExtendSnapshot implements api.Manager.ExtendSnapshot: the snapshot is
// kept days from now.
func (sp *Snapshots) ExtendSnapshot(ctx context.Context, owner, id string, days int) (*Snapshot, error) {
	if _, err := sp.getSnapshot(ctx, owner, id); err != nil {
		return nil, err
	}
	ss, _ := sp.store()
	exp := sp.host.now().Add(time.Duration(days) * 24 * time.Hour)
	sn, err := ss.UpdateSnapshot(ctx, id, func(s *Snapshot) bool {
		if s.State == SnapshotDeleted {
			return false
		}
		s.RetentionDays, s.ExpiresAt = days, &exp
		return true
	})
	if err == nil && sn.State == SnapshotDeleted {
		return nil, snapshotNotFound(id)
	}
	return sn, err
}

// DeleteSnapshot implements api.Manager.DeleteSnapshot. The snapshot is
// gone for its owner at once; its files stay while any sandbox made from
// it exists (their disks are built on its disk), and go with the last.
func (sp *Snapshots) DeleteSnapshot(ctx context.Context, owner, id string) error {
	if _, err := sp.getSnapshot(ctx, owner, id); err != nil {
		return err
	}
	if err := sp.markSnapshotDeleted(ctx, id); err != nil {
		return err
	}
	sp.RemoveUnusedSnapshots(ctx)
	return nil
}

func (sp *Snapshots) markSnapshotDeleted(ctx context.Context, id string) error {
	ss, err := sp.store()
	if err != nil {
		return err
	}
	now := sp.host.now()
	sn, err := ss.UpdateSnapshot(ctx, id, func(s *Snapshot) bool {
		if s.State == SnapshotDeleted {
			return false
		}
		s.State, s.DeletedAt = SnapshotDeleted, &now
		return true
	})
	if err == nil && sn.ReadyAt != nil {
		// Charged up to its deletion, not only to the last periodic charge.
		if err := sp.charges.AccrueStorage(ctx, sn.ID, metering.KindSnapshot, sn.OwnerKeyID, sn.SizeBytes, sn.CreatedAt, now); err != nil {
			sp.log.Warn("charging a deleted snapshot", "snapshot_id", sn.ID, "err", err)
		}
	}
	return err
}

// ExpireSnapshots deletes the snapshots whose retention has ended and
// removes the files no sandbox needs any more. It returns the ids of the
// snapshots it deleted.
func (sp *Snapshots) ExpireSnapshots(ctx context.Context) []string {
	ss, err := sp.store()
	if err != nil {
		return nil
	}
	expired, err := ss.ExpiredSnapshots(ctx, sp.host.now())
	if err != nil {
		sp.log.Error("listing expired snapshots", "err", err)
		return nil
	}
	var ids []string
	for _, sn := range expired {
		if err := sp.markSnapshotDeleted(ctx, sn.ID); err != nil {
			sp.log.Error("deleting an expired snapshot", "snapshot_id", sn.ID, "err", err)
			continue
		}
		sp.log.Info("snapshot retention ended; deleted", "snapshot_id", sn.ID)
		ids = append(ids, sn.ID)
	}
	sp.RemoveUnusedSnapshots(ctx)
	return ids
}

// RemoveUnusedSnapshots removes the files of deleted snapshots that no
// sandbox but a deleted one was made from and that no snapshot with files
// is a difference over: removing a delta's files can free its base's, so
// it goes round again until nothing more is freed.
func (sp *Snapshots) RemoveUnusedSnapshots(ctx context.Context) {
	ss, err := sp.store()
	if err != nil {
		return
	}
	for round := 0; round < 8; round++ {
		ids, err := ss.UnusedDeletedSnapshots(ctx)
		if err != nil {
			sp.log.Error("listing unused snapshots", "err", err)
			return
		}
		removed := 0
		for _, id := range ids {
			if err := removeAll(sp.dir(id)); err != nil {
				sp.log.Error("removing a deleted snapshot's files", "snapshot_id", id, "err", err)
				continue
			}
			now := sp.host.now()
			if _, err := ss.UpdateSnapshot(ctx, id, func(s *Snapshot) bool {
				s.FilesRemovedAt = &now
				return true
			}); err != nil {
				sp.log.Error("recording a deleted snapshot's files removed", "snapshot_id", id, "err", err)
				continue
			}
			removed++
		}
		if removed == 0 {
			return
		}
	}
}

// copySource checks the snapshot a create names, fills the spec with its
// shape, and makes sure its files are here. The snapshot is pinned here
// (unpin) until the create has recorded its copy or failed.
func (sp *Snapshots) copySource(ctx context.Context, owner string, spec *CreateSpec) (*Snapshot, error) {
	sn, err := sp.getSnapshot(ctx, owner, spec.SnapshotID)
	if err != nil {
		return nil, err
	}
	if sn.State != SnapshotReady {
		return nil, errdefs.New(errdefs.ErrConflict, "snapshot_not_ready", "snapshot %s is %s", sn.ID, sn.State).
			WithHint("only a ready snapshot can be copied")
	}
	spec.VCPU, spec.MemoryMiB, spec.DiskMiB = sn.VCPU, sn.MemoryMiB, sn.DiskMiB
	sp.pin(sn.ID)
	if err := sp.ensureLocal(ctx, sn); err != nil {
		sp.unpin(sn.ID)
		return nil, err
	}
	return sn, nil
}

// bootCopy starts a sandbox made from a snapshot: its directory becomes a
// copy of the snapshot's, then a memory snapshot's copy is resumed and
// renewed (its own randomness, clock, hostname, machine-id and boot id),
// and a disk snapshot's copy boots from its disk.
func (m *Manager) bootCopy(ctx context.Context, in *instance, sb *Sandbox, sn *Snapshot, env map[string]string) {
	spec := m.files.vmSpec(sb)
	cctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	err := m.cfg.Driver.Clone(cctx, m.Snapshots.dir(sn.ID), spec)
	cancel()
	in.steps.mark("clone")
	if err != nil {
		defer close(in.bootDone)
		m.log.Error("copying a snapshot", "sandbox_id", sb.ID, "snapshot_id", sn.ID, "err", err)
		m.event(sb.ID, "boot_failed", "copying the snapshot failed", map[string]any{"snapshotId": sn.ID})
		if ctx.Err() == nil {
			m.finish(in, ReasonStartFailed)
		}
		return
	}
	if sn.Mode != SnapshotModeMemory {
		m.boot(ctx, in, sb, env, true)
		return
	}
	defer close(in.bootDone)
	start := time.Now()
	err = m.resumeCopy(ctx, in, sb, env)
	if err == nil {
		m.prepareReady(ctx, in, sb, map[string]any{"snapshotId": sn.ID, "resumeMs": time.Since(start).Milliseconds()})
		return
	}
	m.log.Warn("resuming a copy failed", "sandbox_id", sb.ID, "err", err)
	m.event(sb.ID, "boot_failed", "resuming the copy failed", map[string]any{"snapshotId": sn.ID})
	if ctx.Err() == nil && !m.closing.Load() {
		m.finish(in, ReasonStartFailed)
	}
}

func (m *Manager) resumeCopy(ctx context.Context, in *instance, sb *Sandbox, env map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	defer cancel()
	b, err := m.bootGuest(ctx, bootPlan{
		in:       in,
		start:    resumeVM(m.cfg.Driver, m.files, sb, "the copy"),
		record:   func(mach vmm.Machine) error { return m.recordStarting(sb.ID, mach, "stopped while resuming") },
		paused:   true,
		restored: true,
		renew:    agentproto.RenewRequest{Hostname: hostname(sb), MachineID: randomHex(16), BootID: randomUUID()},
		ready: func(ctx context.Context, _ vmm.Machine, c *guest.Client) error {
			if len(env) == 0 {
				return nil
			}
			if err := c.Configure(ctx, agentproto.ConfigureRequest{Env: env}); err != nil {
				return fmt.Errorf("configuring the copy: %w", err)
			}
			return nil
		},
	})
	if err != nil && b.mach != nil {
		_ = b.mach.Stop(context.Background())
	}
	return err
}

// hostname is a copy's host name: its name made a valid RFC 1123 label
// (lower case letters, digits and inner hyphens, at most 63 bytes), or its
// id's when nothing of the name is left.
func hostname(sb *Sandbox) string {
	label := func(s string) string {
		b := make([]byte, 0, len(s))
		for _, r := range strings.ToLower(s) {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
				b = append(b, byte(r))
			case len(b) > 0 && b[len(b)-1] != '-':
				b = append(b, '-')
			}
		}
		return strings.Trim(string(b[:min(len(b), 63)]), "-")
	}
	if h := label(sb.Name); h != "" {
		return h
	}
	return label(sb.ID)
}
