package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/vmm"
)

// A sandbox's checkpoints move with it. Their files are sent ahead of the
// sandbox's (StageCheckpoint keeps them apart, under incoming/), put in
// place by the sandbox's MoveIn once its own files check out, and become
// the new node's in the same commit that moves the sandbox: the records
// of the sandbox and of the checkpoints taken switch together, so a
// restore never finds the one without the other. A checkpoint is
// immutable, so a copy left on the old node (a sandbox there is a copy of
// it, and reads its disk) is the same files; it is removed once no
// sandbox there needs it (Snapshots.removeElsewhere).

// Outgoing is a paused sandbox on its way to another node: what MoveOut
// hands its send.
type Outgoing struct {
	Sandbox *Sandbox
	// Files are the sandbox's VM's files: the name each takes in its new
	// directory, mapped to its path here (vmm.Mover.MoveFiles).
	Files map[string]string
	// Checkpoints are its checkpoints' files, each base before the
	// checkpoints whose memory is a difference over it.
	Checkpoints []OutgoingCheckpoint
	// Taken is for send to set: the checkpoints the new node took.
	Taken []string
}

// OutgoingCheckpoint is one checkpoint's files, named as
// vmm.SnapshotMover.SnapshotFiles names them.
type OutgoingCheckpoint struct {
	ID    string
	Files map[string]string
}

// Incoming is a paused sandbox arriving from another node: what MoveIn
// takes in.
type Incoming struct {
	Sandbox *Sandbox
	// Checkpoints are the ids of its checkpoints staged here
	// (StageCheckpoint) to take with it, each base before the checkpoints
	// over it.
	Checkpoints []string
	// Receive writes the sandbox's files into the staging directory dir.
	Receive func(ctx context.Context, dir string) error
	// Commit makes the sandbox and the checkpoints taken this node's.
	Commit func(ctx context.Context, checkpoints []string) error
}

// snapshotMover is the driver's vmm.SnapshotMover, if the driver and the
// store can move checkpoints.
func (mv *Moves) snapshotMover() (vmm.SnapshotMover, SnapshotStore, bool) {
	sm, ok := mv.driver.(vmm.SnapshotMover)
	if !ok || mv.snaps == nil {
		return nil, nil, false
	}
	ss, err := mv.snaps.store()
	return sm, ss, err == nil
}

// outgoingCheckpoints lists the files of sb's ready checkpoints and of
// the bases they are differences over, bases first. A checkpoint whose
// files cannot be named stays here (its restore then answers
// checkpoint_elsewhere).
func (mv *Moves) outgoingCheckpoints(ctx context.Context, sb *Sandbox) []OutgoingCheckpoint {
	sm, ss, ok := mv.snapshotMover()
	if !ok {
		return nil
	}
	list, err := mv.snaps.checkpoints(ctx, sb.OwnerKeyID, sb.ID)
	if err != nil {
		mv.log.Warn("moving a sandbox: listing its checkpoints; they stay here", "sandbox_id", sb.ID, "err", err)
		return nil
	}
	var bases, deltas []*Snapshot
	seen := map[string]bool{}
	for _, c := range list {
		if c.State != SnapshotReady || seen[c.ID] {
			continue
		}
		seen[c.ID] = true
		if c.BaseID == "" {
			bases = append(bases, c)
			continue
		}
		deltas = append(deltas, c)
		if seen[c.BaseID] {
			continue
		}
		// A deleted base keeps its files while a difference over it does.
		if base, err := ss.GetSnapshot(ctx, c.BaseID); err == nil && base.FilesRemovedAt == nil {
			seen[base.ID] = true
			bases = append(bases, base)
		}
	}
	var out []OutgoingCheckpoint
	for _, c := range append(bases, deltas...) {
		files, err := sm.SnapshotFiles(mv.snaps.dir(c.ID))
		if err != nil {
			mv.log.Warn("moving a sandbox: a checkpoint's files; it stays here", "sandbox_id", sb.ID,
				"checkpoint_id", c.ID, "err", err)
			continue
		}
		out = append(out, OutgoingCheckpoint{ID: c.ID, Files: files})
	}
	return out
}

// OutgoingCheckpoints lists the files of sandbox id's checkpoints as
// MoveOut would hand them to its send: a running sandbox's drain sends
// them before it pauses the sandbox (a checkpoint never changes), so that
// the pause carries the sandbox's own files alone, and those taken since.
func (mv *Moves) OutgoingCheckpoints(ctx context.Context, id string) []OutgoingCheckpoint {
	sb, err := mv.records.GetSandbox(ctx, id)
	if err != nil {
		return nil
	}
	return mv.outgoingCheckpoints(ctx, sb)
}

// checkpointStage is where the checkpoints of sandbox id moving here wait
// for it.
func (mv *Moves) checkpointStage(id string) string {
	return filepath.Join(mv.incomingDir(), id+".checkpoints")
}

// StageCheckpoint takes in the files of checkpoint cid of sandbox id,
// which is moving here: receive writes them into the empty directory it is
// given, where they wait for the sandbox's MoveIn. A checkpoint staged
// again replaces the earlier one.
func (mv *Moves) StageCheckpoint(ctx context.Context, id, cid string, receive func(ctx context.Context, dir string) error) (err error) {
	if _, ss, ok := mv.snapshotMover(); !ok {
		return errdefs.New(errdefs.ErrUnavailable, "move_unsupported", "this node cannot take in checkpoints")
	} else if _, err := mv.movableCheckpoint(ctx, ss, id, cid); err != nil {
		return err
	}
	mv.removeStaleStages(staleStage)
	dir := filepath.Join(mv.checkpointStage(id), cid)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("staging checkpoint %s: %w", cid, err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("staging checkpoint %s: %w", cid, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("staging checkpoint %s: %w", cid, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := receive(ctx, dir); err != nil {
		return fmt.Errorf("staging checkpoint %s: %w", cid, err)
	}
	return nil
}

// staleStage is how long checkpoints staged for a sandbox that never came
// (its move failed on the sending node, which wakes it there) are kept.
const staleStage = time.Hour

// removeStaleStages removes the checkpoints staged for sandboxes that did
// not follow them within age.
func (mv *Moves) removeStaleStages(age time.Duration) {
	entries, err := os.ReadDir(mv.incomingDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !e.IsDir() || !strings.HasSuffix(e.Name(), ".checkpoints") || time.Since(info.ModTime()) < age {
			continue
		}
		if err := os.RemoveAll(filepath.Join(mv.incomingDir(), e.Name())); err != nil {
			mv.log.Warn("removing checkpoints staged for a move that did not come", "dir", e.Name(), "err", err)
		}
	}
}

// movableCheckpoint loads checkpoint cid and checks that it is a memory
// checkpoint of sandbox id that still has files.
func (mv *Moves) movableCheckpoint(ctx context.Context, ss SnapshotStore, id, cid string) (*Snapshot, error) {
	if !validSandboxID(id) || !validCheckpointID(cid) {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "moving in: not a sandbox and checkpoint id")
	}
	sn, err := ss.GetSnapshot(ctx, cid)
	if err != nil {
		return nil, err
	}
	if sn.CheckpointOf != id || sn.Mode != SnapshotModeMemory || sn.FilesRemovedAt != nil {
		return nil, errdefs.New(errdefs.ErrConflict, "not_movable", "%s is not a checkpoint of sandbox %s with files", cid, id)
	}
	return sn, nil
}

// takeCheckpoints puts in place those of the checkpoints ids of sb staged
// here that check out (in order: a difference needs its base here), and
// returns them with an undo that removes them again. One that does not
// check out is left behind, logged: the sandbox moves without it.
func (mv *Moves) takeCheckpoints(ctx context.Context, sb *Sandbox, ids []string) (taken []string, undo func()) {
	stage := mv.checkpointStage(sb.ID)
	defer os.RemoveAll(stage)
	var placed []string
	undo = func() {
		for _, dir := range placed {
			if err := removeAll(dir); err != nil {
				mv.log.Warn("removing the checkpoints of a failed move", "sandbox_id", sb.ID, "err", err)
			}
		}
	}
	sm, ss, ok := mv.snapshotMover()
	if !ok || len(ids) == 0 {
		return nil, undo
	}
	for _, cid := range ids {
		final, err := mv.takeCheckpoint(ctx, sm, ss, sb.ID, cid)
		if err != nil {
			mv.log.Warn("moving in a sandbox: a checkpoint did not arrive whole; it stays on the node it left",
				"sandbox_id", sb.ID, "checkpoint_id", cid, "err", err)
			continue
		}
		taken = append(taken, cid)
		if final != "" {
			placed = append(placed, final)
		}
	}
	return taken, undo
}

// takeCheckpoint puts checkpoint cid, staged, in place, and returns its
// directory if it put it there ("" if it was here already: a checkpoint
// never changes, and this node kept its files for a copy of it).
func (mv *Moves) takeCheckpoint(ctx context.Context, sm vmm.SnapshotMover, ss SnapshotStore, id, cid string) (string, error) {
	sn, err := mv.movableCheckpoint(ctx, ss, id, cid)
	if err != nil {
		return "", err
	}
	final := mv.snaps.dir(cid)
	if _, err := os.Lstat(final); err == nil {
		return "", nil
	}
	baseDir := ""
	if sn.BaseID != "" {
		baseDir = mv.snaps.dir(sn.BaseID)
		if _, err := os.Stat(baseDir); err != nil {
			return "", fmt.Errorf("its base %s is not here: %w", sn.BaseID, err)
		}
	}
	staged := filepath.Join(mv.checkpointStage(id), cid)
	// "" is the default image, as for the sandbox it was taken of.
	rootfs := mv.files.rootfs(&Sandbox{Rootfs: sn.Rootfs})
	spec := vmm.Spec{ID: cid, Dir: staged, Rootfs: rootfs, MemoryMiB: sn.MemoryMiB}
	if err := sm.SnapshotMoved(ctx, spec, baseDir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(staged, final); err != nil {
		return "", err
	}
	return final, nil
}
