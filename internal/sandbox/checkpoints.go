package sandbox

import (
	"context"
	"errors"
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

// checkpointStore is what checkpoints need of the store beyond snapshots.
type checkpointStore interface {
	CheckpointBytes(ctx context.Context, owner string) (int64, error)
}

func checkpointNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "checkpoint_not_found", "no checkpoint %q", id)
}

// Checkpoint implements api.Manager.Checkpoint: a memory snapshot of the
// sandbox that belongs to it. With wait it answers once the capture is
// over (ready, or failed with the sandbox running on); without, at once
// with the checkpoint capturing, while the capture goes on in the
// background (a call into the sandbox meanwhile waits for it: the guest
// is stopped for the copy). The oldest of its checkpoints past the
// per-sandbox bound are deleted once it is ready.
func (m *Manager) Checkpoint(ctx context.Context, owner, id, label string, wait bool) (_ *Snapshot, err error) {
	defer func() { m.outcomes.op("checkpoint", err) }()
	sn, capture, err := m.checkpoint(ctx, owner, id, label, "")
	if err != nil || !wait {
		if err == nil && !m.spawn(func() { _, _ = capture(m.ctx) }) {
			return nil, errdefs.New(errdefs.ErrUnavailable, "shutting_down", "the server is shutting down")
		}
		return sn, err
	}
	return capture(context.WithoutCancel(ctx))
}

// checkpoint begins a checkpoint of sandbox id: it is recorded capturing
// and capture takes it. Neither the bounds nor the quota delete
// checkpoint keep (one about to be restored).
func (m *Manager) checkpoint(ctx context.Context, owner, id, label, keep string) (*Snapshot, func(context.Context) (*Snapshot, error), error) {
	sp := m.Snapshots
	if _, err := sp.store(); err != nil {
		return nil, nil, err
	}
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, nil, err
	}
	if err := sp.checkQuota(ctx, owner, id, keep); err != nil {
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
			m.log.Info("checkpoint taken", "sandbox_id", id, "checkpoint_id", got.ID, "bytes", got.SizeBytes,
				"took", time.Since(start).Round(time.Millisecond))
			sp.prune(ctx, owner, id, m.cfg.Checkpoints.perSandbox(), keep)
		}
		return got, err
	}
	return sn, capture, nil
}

// checkQuota refuses a new checkpoint of sandbox id once owner's
// checkpoints take the quota, after the sandbox's own oldest ones have
// been deleted to make room (keeping its newest, and keep).
func (sp *Snapshots) checkQuota(ctx context.Context, owner, id, keep string) error {
	cs, ok := sp.records.(checkpointStore)
	if !ok {
		return nil
	}
	quota := sp.host.checkpointLimits().quota()
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
func (sp *Snapshots) prune(ctx context.Context, owner, id string, max int, keep string) {
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

// ListCheckpoints implements api.Manager.ListCheckpoints: the checkpoints
// of owner's sandbox id, oldest first.
func (m *Manager) ListCheckpoints(ctx context.Context, owner, id string) ([]*Snapshot, error) {
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	return m.Snapshots.checkpoints(ctx, owner, id)
}

// GetCheckpoint implements api.Manager.GetCheckpoint.
func (m *Manager) GetCheckpoint(ctx context.Context, owner, id, cid string) (*Snapshot, error) {
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	sn, err := m.Snapshots.getSnapshot(ctx, owner, cid)
	if errdefs.IsNotFound(err) || (err == nil && sn.CheckpointOf != id) {
		return nil, checkpointNotFound(cid)
	}
	return sn, err
}

// DeleteCheckpoint implements api.Manager.DeleteCheckpoint. Its files go
// once no branch made from it needs them.
func (m *Manager) DeleteCheckpoint(ctx context.Context, owner, id, cid string) error {
	if _, err := m.GetCheckpoint(ctx, owner, id, cid); err != nil {
		return err
	}
	if err := m.Snapshots.markSnapshotDeleted(ctx, cid); err != nil {
		return err
	}
	m.Snapshots.RemoveUnusedSnapshots(ctx)
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

// readyCheckpoint loads checkpoint cid of owner's sandbox id and checks
// that it can be restored or branched from.
func (m *Manager) readyCheckpoint(ctx context.Context, owner, id, cid string) (*Snapshot, error) {
	sn, err := m.GetCheckpoint(ctx, owner, id, cid)
	if err != nil {
		return nil, err
	}
	if sn.State != SnapshotReady {
		return nil, errdefs.New(errdefs.ErrConflict, "checkpoint_not_ready", "checkpoint %s is %s", cid, sn.State).
			WithHint("only a ready checkpoint can be restored or branched from")
	}
	if _, err := os.Stat(m.Snapshots.dir(sn.ID)); err != nil {
		// A sandbox moved to another node of a cluster leaves its
		// checkpoints' files behind (they do not move yet).
		return nil, errdefs.New(errdefs.ErrConflict, "checkpoint_elsewhere",
			"checkpoint %s is not on the node the sandbox is on now", cid).
			WithHint("a sandbox moved by a drain keeps its checkpoints' records but not their files; take a new checkpoint")
	}
	return sn, nil
}

// RestoreCheckpoint implements api.Manager.RestoreCheckpoint: sandbox id
// goes back to checkpoint cid, with the memory, processes and disk it had
// then, and runs on from there under the same id, previews and settings;
// what it did since is lost unless keep, which first checkpoints it. A
// running sandbox is paused for it; it answers once the sandbox runs again.
func (m *Manager) RestoreCheckpoint(ctx context.Context, owner, id, cid string, keep bool) (_ *Sandbox, err error) {
	defer func() { m.outcomes.op("restore", err) }()
	sn, err := m.readyCheckpoint(ctx, owner, id, cid)
	if err != nil {
		return nil, err
	}
	sb, err := m.Snapshots.settleRunning(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sb.Rootfs != sn.Rootfs || sb.MemoryMiB != sn.MemoryMiB || sb.DiskMiB != sn.DiskMiB {
		return nil, errdefs.New(errdefs.ErrConflict, "checkpoint_incompatible",
			"sandbox %s has changed its image or size since checkpoint %s", id, cid).
			WithHint("branch from the checkpoint instead: a new sandbox starts from it")
	}
	if keep {
		_, capture, err := m.checkpoint(ctx, owner, id, "before-restore", cid)
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
			if sb, err = m.pause(ctx, id, "restore"); err != nil {
				return nil, err
			}
			if sb, err = m.Snapshots.settleRunning(ctx, owner, id); err != nil {
				return nil, err
			}
		}
		done, err := m.restoreFiles(ctx, id, sn)
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
		if sb, err = m.Snapshots.settleRunning(ctx, owner, id); err != nil {
			return nil, err
		}
	}
	pausedFor := time.Since(start)
	if _, err := m.wake(ctx, id, nil); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout+10*time.Second)
	defer cancel()
	sb, err = m.WaitFor(wctx, owner, id, StateRunning)
	if err != nil {
		return nil, err
	}
	m.event(id, "restored", "sandbox restored to a checkpoint", map[string]any{"checkpointId": cid,
		"filesMs": pausedFor.Milliseconds(), "restoreMs": time.Since(start).Milliseconds()})
	return sb, nil
}

// restoreFiles puts the files of paused sandbox id back to checkpoint
// sn's, under its VM lock. done is false if the sandbox is not paused
// (woken meanwhile).
func (m *Manager) restoreFiles(ctx context.Context, id string, sn *Snapshot) (done bool, err error) {
	unlock := m.lockOp(id)
	defer unlock()
	sb, err := m.cfg.Store.GetSandbox(ctx, id)
	if err != nil {
		return false, err
	}
	if sb.State != StatePaused {
		if sb.State.Terminal() || sb.State == StateDeleting {
			return false, Refusal(sb)
		}
		return false, nil
	}
	if !m.cfg.Admission.Held(id) {
		return false, errNotOnNode(id)
	}
	rctx, cancel := context.WithTimeout(ctx, captureTimeout)
	defer cancel()
	if err := vmm.Restore(rctx, m.cfg.Driver, m.Snapshots.dir(sn.ID), m.files.vmSpec(sb)); err != nil {
		m.log.Error("restoring a checkpoint", "sandbox_id", id, "checkpoint_id", sn.ID, "err", err)
		if errors.Is(err, errors.ErrUnsupported) {
			return false, errdefs.New(errdefs.ErrUnavailable, "checkpoints_unavailable", "this server's VMM cannot restore checkpoints")
		}
		if !m.cfg.Driver.Saved(m.files.vmSpec(sb)) {
			// Its own saved state is gone with the failed copy: it cannot
			// be resumed, so it is stopped with its disk kept.
			m.markStopped(id, ReasonWakeFailed)
		}
		return false, errdefs.New(errdefs.ErrInternal, "restore_failed", "restoring checkpoint %s of %s failed", sn.ID, id)
	}
	return true, nil
}

// BranchCheckpoint implements api.Manager.BranchCheckpoint: spec.Count new
// sandboxes made from checkpoint cid of sandbox id (the state it had then,
// not its present one), answered once they all run.
func (m *Manager) BranchCheckpoint(ctx context.Context, owner, id, cid string, spec ForkSpec) (_ []*Sandbox, err error) {
	defer func() { m.outcomes.op("branch", err) }()
	if spec.Count < 1 || spec.Count > MaxForkCount {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "count must be from 1 to %d", MaxForkCount)
	}
	src, err := m.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	sn, err := m.readyCheckpoint(ctx, owner, id, cid)
	if err != nil {
		return nil, err
	}
	return m.copies(ctx, owner, src, sn, spec)
}

// checkpointLimits implements snapshotHost.checkpointLimits.
func (m *Manager) checkpointLimits() CheckpointLimits { return m.cfg.Checkpoints }
