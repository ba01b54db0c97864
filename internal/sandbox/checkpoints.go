package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/vmm"
)

// A checkpoint is a memory snapshot that belongs to one sandbox: taken
// between an agent's steps, it lets the same sandbox go back to that
// moment (restore: same id, previews, lease settings and egress; its
// memory, processes and disk as they were) or new sandboxes start from it
// (branch). It is stored as a snapshot whose CheckpointOf names the
// sandbox: listed under the sandbox only, never expiring by retention,
// deleted with the sandbox, and bounded by CheckpointLimits. Its files
// stay while a branch made from it exists, as a snapshot's do; a restore
// copies them, so a restored sandbox needs nothing of its checkpoints.

// CheckpointLimits bounds checkpoints. Zero fields take the defaults.
type CheckpointLimits struct {
	// PerSandbox is how many checkpoints a sandbox keeps: a new one past
	// it deletes the oldest (DefaultCheckpointsPerSandbox).
	PerSandbox int
	// QuotaBytes is the disk the checkpoints of one key's sandboxes may
	// take together (DefaultCheckpointQuotaBytes); a checkpoint is refused
	// with quota_exceeded once it is reached and the sandbox's own oldest
	// checkpoints do not free enough.
	QuotaBytes int64
}

// Defaults of CheckpointLimits.
const (
	DefaultCheckpointsPerSandbox       = 20
	DefaultCheckpointQuotaBytes  int64 = 64 << 30
)

// MaxCheckpointLabelLen bounds a checkpoint's label.
const MaxCheckpointLabelLen = 63

func (l CheckpointLimits) perSandbox() int {
	if l.PerSandbox <= 0 {
		return DefaultCheckpointsPerSandbox
	}
	return l.PerSandbox
}

func (l CheckpointLimits) quota() int64 {
	if l.QuotaBytes <= 0 {
		return DefaultCheckpointQuotaBytes
	}
	return l.QuotaBytes
}

// Checkpoints takes, restores and branches from the checkpoints of
// sandboxes, on top of Snapshots; Manager.Checkpoints returns the
// manager's. What changes a sandbox's state goes through checkpointHost:
// the manager's pause, wake and VM lock.
type Checkpoints struct {
	host     checkpointHost
	snaps    *Snapshots
	records  Store
	driver   vmm.Driver
	held     func(id string) bool // the sandbox is paused here (Ledger.Held)
	files    sandboxFiles
	limits   CheckpointLimits
	boot     time.Duration // how long a sandbox starting may take to run
	log      *slog.Logger
	outcomes outcomes
	ctx      context.Context // the manager's: a background capture ends with it
}

// checkpointHost is what checkpoints need of the manager.
type checkpointHost interface {
	Get(ctx context.Context, owner, id string) (*Sandbox, error)
	WaitFor(ctx context.Context, owner, id string, states ...State) (*Sandbox, error)
	pause(ctx context.Context, id, why string) (*Sandbox, error)
	wake(ctx context.Context, id string, timeout *int) (*Sandbox, error)
	lockOp(id string) (unlock func())
	markStopped(id, reason string)
	event(id, typ, msg string, data map[string]any)
	spawn(f func()) bool
}

func newCheckpoints(m *Manager) *Checkpoints {
	return &Checkpoints{host: m, snaps: m.Snapshots, records: m.cfg.Store, driver: m.cfg.Driver,
		held: m.cfg.Admission.Held, files: m.files, limits: m.cfg.Checkpoints, boot: m.cfg.BootTimeout,
		log: m.log, outcomes: m.outcomes, ctx: m.ctx}
}

// checkpointStore is what checkpoints need of the store beyond snapshots.
type checkpointStore interface {
	CheckpointBytes(ctx context.Context, owner string) (int64, error)
}

func checkpointNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "checkpoint_not_found", "no checkpoint %q", id)
}

// Checkpoint implements api.CheckpointManager.Checkpoint: a memory snapshot of the
// sandbox that belongs to it. With wait it answers once the capture is
// over (ready, or failed with the sandbox running on); without, at once
// with the checkpoint capturing, while the capture goes on in the
// background (a call into the sandbox meanwhile waits for it: the guest
// is stopped for the copy). The oldest of its checkpoints past the
// per-sandbox bound are deleted once it is ready.
func (cp *Checkpoints) Checkpoint(ctx context.Context, owner, id, label string, wait bool) (_ *Snapshot, err error) {
	defer func() { cp.outcomes.op("checkpoint", err) }()
	sn, capture, err := cp.begin(ctx, owner, id, label, "")
	if err != nil || !wait {
		if err == nil && !cp.host.spawn(func() { _, _ = capture(cp.ctx) }) {
			return nil, errdefs.New(errdefs.ErrUnavailable, "shutting_down", "the server is shutting down")
		}
		return sn, err
	}
	return capture(context.WithoutCancel(ctx))
}

// begin begins a checkpoint of sandbox id: it is recorded capturing and
// capture takes it. Neither the bounds nor the quota delete checkpoint
// keep (one about to be restored).
func (cp *Checkpoints) begin(ctx context.Context, owner, id, label, keep string) (*Snapshot, func(context.Context) (*Snapshot, error), error) {
	sp := cp.snaps
	if _, err := sp.store(); err != nil {
		return nil, nil, err
	}
	if _, err := cp.host.Get(ctx, owner, id); err != nil {
		return nil, nil, err
	}
	if err := cp.checkQuota(ctx, owner, id, keep); err != nil {
		return nil, nil, err
	}
	spec := SnapshotSpec{Name: label, Mode: SnapshotModeMemory, checkpointOf: id}
	if list, err := sp.checkpoints(ctx, owner, id); err == nil {
		// Over the newest whole checkpoint, the memory is what the steps
		// since changed (D22).
		for _, c := range slices.Backward(list) {
			if c.State == SnapshotReady && c.BaseID == "" {
				spec.base = c
				break
			}
		}
	}
	sn, snap, err := sp.begin(ctx, owner, id, spec)
	if err != nil {
		return nil, nil, err
	}
	capture := func(ctx context.Context) (*Snapshot, error) {
		start := time.Now()
		got, err := snap(ctx)
		if err == nil && got.State == SnapshotReady {
			cp.log.Info("checkpoint taken", "sandbox_id", id, "checkpoint_id", got.ID, "bytes", got.SizeBytes,
				"base_id", got.BaseID, "took", time.Since(start).Round(time.Millisecond))
			cp.prune(ctx, owner, id, cp.limits.perSandbox(), keep)
		}
		return got, err
	}
	return sn, capture, nil
}

// checkQuota refuses a new checkpoint of sandbox id once owner's
// checkpoints take the quota, after the sandbox's own oldest ones have
// been deleted to make room (keeping its newest, and keep).
func (cp *Checkpoints) checkQuota(ctx context.Context, owner, id, keep string) error {
	sp := cp.snaps
	cs, ok := cp.records.(checkpointStore)
	if !ok {
		return nil
	}
	quota := cp.limits.quota()
	for {
		used, err := cs.CheckpointBytes(ctx, owner)
		if err != nil {
			return err
		}
		if used < quota {
			return nil
		}
		list, err := sp.checkpoints(ctx, owner, id)
		if err != nil {
			return err
		}
		list = slices.DeleteFunc(list, func(sn *Snapshot) bool { return sn.ID == keep })
		if len(list) <= 1 {
			e := errdefs.New(errdefs.ErrConflict, "quota_exceeded",
				"this key's checkpoints take %d of its %d bytes", used, quota).
				WithHint("delete checkpoints (of this or other sandboxes), or delete sandboxes you no longer need")
			e.Details = map[string]any{"usedBytes": used, "quotaBytes": quota}
			return e
		}
		if err := sp.markSnapshotDeleted(ctx, list[0].ID); err != nil {
			return err
		}
		sp.RemoveUnusedSnapshots(ctx)
		sp.log.Info("checkpoint deleted to make room in the key's quota", "sandbox_id", id, "checkpoint_id", list[0].ID)
	}
}

// prune deletes the oldest checkpoints of sandbox id beyond max, sparing
// keep (which still counts).
func (cp *Checkpoints) prune(ctx context.Context, owner, id string, max int, keep string) {
	sp := cp.snaps
	list, err := sp.checkpoints(ctx, owner, id)
	if err != nil {
		sp.log.Warn("listing checkpoints to prune", "sandbox_id", id, "err", err)
		return
	}
	pruned := 0
	for i := 0; i < len(list) && len(list)-pruned > max; i++ {
		if list[i].ID == keep {
			continue
		}
		if err := sp.markSnapshotDeleted(ctx, list[i].ID); err != nil {
			sp.log.Warn("pruning a checkpoint", "checkpoint_id", list[i].ID, "err", err)
			return
		}
		pruned++
	}
	if pruned > 0 {
		sp.RemoveUnusedSnapshots(ctx)
	}
}

// checkpoints lists the checkpoints of sandbox id that are not deleted,
// oldest first.
func (sp *Snapshots) checkpoints(ctx context.Context, owner, id string) ([]*Snapshot, error) {
	ss, err := sp.store()
	if err != nil {
		return nil, err
	}
	var all []*Snapshot
	opts := SnapshotListOptions{OwnerKeyID: owner, CheckpointOf: id, Limit: 100}
	for {
		page, next, err := ss.ListSnapshots(ctx, opts)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next == "" {
			break
		}
		opts.Cursor = next
	}
	slices.Reverse(all) // the store lists newest first
	return all, nil
}

// ListCheckpoints implements api.CheckpointManager.ListCheckpoints: the checkpoints
// of owner's sandbox id, oldest first.
func (cp *Checkpoints) ListCheckpoints(ctx context.Context, owner, id string) ([]*Snapshot, error) {
	if _, err := cp.host.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	return cp.snaps.checkpoints(ctx, owner, id)
}

// GetCheckpoint implements api.CheckpointManager.GetCheckpoint.
func (cp *Checkpoints) GetCheckpoint(ctx context.Context, owner, id, cid string) (*Snapshot, error) {
	if _, err := cp.host.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	sn, err := cp.snaps.getSnapshot(ctx, owner, cid)
	if errdefs.IsNotFound(err) || (err == nil && sn.CheckpointOf != id) {
		return nil, checkpointNotFound(cid)
	}
	return sn, err
}

// DeleteCheckpoint implements api.CheckpointManager.DeleteCheckpoint. Its files go
// once no branch made from it needs them.
func (cp *Checkpoints) DeleteCheckpoint(ctx context.Context, owner, id, cid string) error {
	if _, err := cp.GetCheckpoint(ctx, owner, id, cid); err != nil {
		return err
	}
	if err := cp.snaps.markSnapshotDeleted(ctx, cid); err != nil {
		return err
	}
	cp.snaps.RemoveUnusedSnapshots(ctx)
	return nil
}

// dropCheckpoints deletes the checkpoints of sandbox id, which is being
// deleted. It is safe to repeat.
func (sp *Snapshots) dropCheckpoints(ctx context.Context, id string) {
	if _, err := sp.store(); err != nil {
		return
	}
	sb, err := sp.records.GetSandbox(ctx, id)
	if err != nil {
		sp.log.Warn("finding a deleted sandbox's checkpoints", "sandbox_id", id, "err", err)
		return
	}
	list, err := sp.checkpoints(ctx, sb.OwnerKeyID, id)
	if err != nil {
		sp.log.Warn("listing a deleted sandbox's checkpoints", "sandbox_id", id, "err", err)
		return
	}
	for _, sn := range list {
		if err := sp.markSnapshotDeleted(ctx, sn.ID); err != nil {
			sp.log.Warn("deleting a checkpoint with its sandbox", "checkpoint_id", sn.ID, "err", err)
		}
	}
	if len(list) > 0 {
		sp.RemoveUnusedSnapshots(ctx)
	}
}

// ready loads checkpoint cid of owner's sandbox id and checks
// that it can be restored or branched from.
func (cp *Checkpoints) ready(ctx context.Context, owner, id, cid string) (*Snapshot, error) {
	sn, err := cp.GetCheckpoint(ctx, owner, id, cid)
	if err != nil {
		return nil, err
	}
	if sn.State != SnapshotReady {
		return nil, errdefs.New(errdefs.ErrConflict, "checkpoint_not_ready", "checkpoint %s is %s", cid, sn.State).
			WithHint("only a ready checkpoint can be restored or branched from")
	}
	if _, err := os.Stat(cp.snaps.dir(sn.ID)); err != nil {
		// A sandbox moved to another node of a cluster takes its
		// checkpoints along, but one whose files did not arrive whole,
		// or any moved to a node of an older version, stays behind.
		return nil, errdefs.New(errdefs.ErrConflict, "checkpoint_elsewhere",
			"checkpoint %s is not on the node the sandbox is on now", cid).
			WithHint("its files stayed on the node the sandbox moved from (see that node's log); take a new checkpoint")
	}
	return sn, nil
}

// RestoreCheckpoint implements api.CheckpointManager.RestoreCheckpoint: sandbox id
// goes back to checkpoint cid, with the memory, processes and disk it had
// then, and runs on from there under the same id, previews and settings;
// what it did since is lost unless keep, which first checkpoints it. A
// running sandbox is paused for it; it answers once the sandbox runs again.
func (cp *Checkpoints) RestoreCheckpoint(ctx context.Context, owner, id, cid string, keep bool) (_ *Sandbox, err error) {
	defer func() { cp.outcomes.op("restore", err) }()
	sn, err := cp.ready(ctx, owner, id, cid)
	if err != nil {
		return nil, err
	}
	sb, err := cp.snaps.settleRunning(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sb.Rootfs != sn.Rootfs || sb.MemoryMiB != sn.MemoryMiB || sb.DiskMiB != sn.DiskMiB {
		return nil, errdefs.New(errdefs.ErrConflict, "checkpoint_incompatible",
			"sandbox %s has changed its image or size since checkpoint %s", id, cid).
			WithHint("branch from the checkpoint instead: a new sandbox starts from it")
	}
	if keep {
		_, capture, err := cp.begin(ctx, owner, id, "before-restore", cid)
		if err != nil {
			return nil, err
		}
		if kept, err := capture(context.WithoutCancel(ctx)); err != nil {
			return nil, err
		} else if kept.State != SnapshotReady {
			return nil, errdefs.New(errdefs.ErrConflict, "checkpoint_failed",
				"the checkpoint of the present (keep) failed, so nothing was restored")
		}
	}
	start := time.Now()
	for try := 0; ; try++ {
		if sb.State == StateRunning {
			if sb, err = cp.host.pause(ctx, id, "restore"); err != nil {
				return nil, err
			}
			if sb, err = cp.snaps.settleRunning(ctx, owner, id); err != nil {
				return nil, err
			}
		}
		done, err := cp.restoreFiles(ctx, id, sn)
		if err != nil {
			return nil, err
		}
		if done {
			break
		}
		// Woken between the pause and the restore (a call with autoWake):
		// pause it again.
		if try == 2 {
			e := errdefs.New(errdefs.ErrConflict, "sandbox_busy", "sandbox %s kept waking during the restore", id)
			e.RetryAfter = time.Second
			return nil, e
		}
		if sb, err = cp.snaps.settleRunning(ctx, owner, id); err != nil {
			return nil, err
		}
	}
	pausedFor := time.Since(start)
	if _, err := cp.host.wake(ctx, id, nil); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, cp.boot+10*time.Second)
	defer cancel()
	sb, err = cp.host.WaitFor(wctx, owner, id, StateRunning)
	if err != nil {
		return nil, err
	}
	cp.host.event(id, "restored", "sandbox restored to a checkpoint", map[string]any{"checkpointId": cid,
		"filesMs": pausedFor.Milliseconds(), "restoreMs": time.Since(start).Milliseconds()})
	return sb, nil
}

// restoreFiles puts the files of paused sandbox id back to checkpoint
// sn's, under its VM lock. done is false if the sandbox is not paused
// (woken meanwhile).
func (cp *Checkpoints) restoreFiles(ctx context.Context, id string, sn *Snapshot) (done bool, err error) {
	unlock := cp.host.lockOp(id)
	defer unlock()
	sb, err := cp.records.GetSandbox(ctx, id)
	if err != nil {
		return false, err
	}
	if sb.State != StatePaused {
		if sb.State.Terminal() || sb.State == StateDeleting {
			return false, Refusal(sb)
		}
		return false, nil
	}
	if !cp.held(id) {
		return false, errNotOnNode(id)
	}
	rctx, cancel := context.WithTimeout(ctx, captureTimeout)
	defer cancel()
	if err := vmm.Restore(rctx, cp.driver, cp.snaps.dir(sn.ID), cp.files.vmSpec(sb)); err != nil {
		cp.log.Error("restoring a checkpoint", "sandbox_id", id, "checkpoint_id", sn.ID, "err", err)
		if errors.Is(err, errors.ErrUnsupported) {
			return false, errdefs.New(errdefs.ErrUnavailable, "checkpoints_unavailable", "this server's VMM cannot restore checkpoints")
		}
		if !cp.driver.Saved(cp.files.vmSpec(sb)) {
			// Its own saved state is gone with the failed copy: it cannot
			// be resumed, so it is stopped with its disk kept.
			cp.host.markStopped(id, ReasonWakeFailed)
		}
		return false, errdefs.New(errdefs.ErrInternal, "restore_failed", "restoring checkpoint %s of %s failed", sn.ID, id)
	}
	return true, nil
}

// BranchCheckpoint implements api.CheckpointManager.BranchCheckpoint: spec.Count new
// sandboxes made from checkpoint cid of sandbox id (the state it had then,
// not its present one), answered once they all run.
func (cp *Checkpoints) BranchCheckpoint(ctx context.Context, owner, id, cid string, spec ForkSpec) (_ []*Sandbox, err error) {
	defer func() { cp.outcomes.op("branch", err) }()
	if spec.Count < 1 || spec.Count > MaxForkCount {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "count must be from 1 to %d", MaxForkCount)
	}
	src, err := cp.host.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	sn, err := cp.ready(ctx, owner, id, cid)
	if err != nil {
		return nil, err
	}
	return cp.snaps.copies(ctx, owner, src, sn, spec)
}
