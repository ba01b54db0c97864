package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/vmm"
)

// Moving a paused sandbox to another node (a drain). A paused sandbox is
// files alone, its saved VM in its directory, so it moves as files: the
// old node's MoveOut hands them to a sender under the sandbox's VM lock,
// and the new node's MoveIn takes them into a staging directory, puts them
// in place, has the driver make them resumable there and holds the
// sandbox's disk in its ledger. The cluster (internal/cluster) carries the
// files between the two and switches the record's owner (MoveIn's commit);
// until that commit the sandbox is the old node's and stays paused there.

// Moves hands paused sandboxes between the nodes of a cluster, and keeps
// the fences of a node that comes back or is fenced (fence.go).
type Moves struct {
	host    moveHost
	files   sandboxFiles
	snaps   *Snapshots // a moving sandbox's checkpoints go with it
	envs    *envMemory // a moved sandbox's env is forgotten here
	waiters *waiters
	meter   *Meter
	records Store
	driver  vmm.Driver
	ledger  *admission.Ledger
	volumes Volumes // nil: no sandbox holds volumes
	dataDir string
	log     *slog.Logger

	// A running sandbox moves as a paused one: paused here, moved, and
	// woken there. These are the manager's pause, wake and wait.
	pause       func(ctx context.Context, id string) (*Sandbox, error)
	wake        func(ctx context.Context, id string) (*Sandbox, error)
	waitFor     func(ctx context.Context, owner, id string, states ...State) (*Sandbox, error)
	bootTimeout time.Duration

	mu        sync.Mutex
	movingIDs map[string]bool // running sandboxes paused or woken for a move
}

// moveHost is what moves and fences need of the manager: a sandbox's VM
// lock and instance, the clock, and its close.
type moveHost interface {
	lockOp(id string) (unlock func())
	liveInstance(id string) *instance
	instances() []*instance
	now() time.Time
	Close()
}

func newMoves(m *Manager) *Moves {
	return &Moves{host: m, meter: m.Meter, records: m.cfg.Store, driver: m.cfg.Driver, ledger: m.cfg.Admission,
		volumes: m.cfg.Volumes, dataDir: m.cfg.DataDir, log: m.log, files: m.files, snaps: m.Snapshots,
		envs: m.envs, waiters: m.waiters, movingIDs: map[string]bool{},
		pause:       func(ctx context.Context, id string) (*Sandbox, error) { return m.pause(ctx, id, PauseMove) },
		wake:        func(ctx context.Context, id string) (*Sandbox, error) { return m.wake(ctx, id, nil) },
		waitFor:     m.WaitFor,
		bootTimeout: m.cfg.BootTimeout}
}

// liveInstance is the instance of sandbox id, if this process runs its VM.
func (m *Manager) liveInstance(id string) *instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live[id]
}

// incomingDir holds the staging directories of sandboxes moving in; what a
// crash left there is removed at the next start (Recover).
func (mv *Moves) incomingDir() string { return filepath.Join(mv.dataDir, "incoming") }

// MoveOut hands the paused sandbox id to another node: under the
// sandbox's VM lock it checks that the sandbox is paused, here, and holds
// no volumes, then calls send with the record, the files that hold it
// (vmm.Mover.MoveFiles: the name each takes in its new directory, mapped
// to its path here) and its checkpoints' files. If send returns nil the
// sandbox is no longer this manager's: its admission claim is released,
// what is kept of it in memory forgotten and its directory removed, with
// those of the checkpoints the new node took (Outgoing.Taken) that no
// sandbox here is a copy of. An error from send leaves it as it was,
// paused here.
func (mv *Moves) MoveOut(ctx context.Context, id string, send func(ctx context.Context, out *Outgoing) error) error {
	mover, err := mv.mover()
	if err != nil {
		return err
	}
	unlock := mv.host.lockOp(id) // no pause, wake or end of a stop or delete meanwhile
	defer unlock()
	sb, err := mv.records.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if sb.State != StatePaused {
		return notPausedForMove(sb)
	}
	spec := mv.files.vmSpec(sb)
	live := mv.host.liveInstance(id) != nil
	if live || !mv.driver.Saved(spec) || !mv.ledger.Held(id) {
		return errNotOnNode(id)
	}
	if mv.volumes != nil && mv.volumes.Holds(ctx, id) {
		return errdefs.New(errdefs.ErrConflict, "volumes_attached",
			"sandbox %s holds volumes; only a sandbox with no volumes can move to another node", id).
			WithHint("detach its volumes first")
	}
	files, err := mover.MoveFiles(spec)
	if err != nil {
		return fmt.Errorf("moving sandbox %s: %w", id, err)
	}
	// Its disk is charged here up to the move, and by the new node after.
	mv.meter.accrueKept(ctx, sb, mv.host.now())
	out := &Outgoing{Sandbox: sb, Files: files, Checkpoints: mv.outgoingCheckpoints(ctx, sb)}
	if err := send(ctx, out); err != nil {
		return fmt.Errorf("moving sandbox %s: %w", id, err)
	}
	// The sandbox is the other node's now: nothing of it stays here.
	mv.ledger.Release(id)
	mv.envs.remember(id, nil)
	if err := removeAll(mv.files.dir(id)); err != nil {
		mv.log.Warn("removing the files of a sandbox moved to another node", "sandbox_id", id, "err", err)
	}
	mv.snaps.removeElsewhere(ctx, out.Taken)
	mv.log.Info("paused sandbox moved to another node", "sandbox_id", id, "checkpoints", len(out.Taken))
	mv.waiters.notify(id)
	return nil
}

// MoveIn takes in the paused sandbox in.Sandbox (its record as the old
// node has it) moving here: in.Receive writes its files, named as
// MoveFiles named them, into the empty staging directory it is given;
// MoveIn then moves that directory into place, has the driver make the
// files resumable there (vmm.Mover.Moved), puts in place those of
// in.Checkpoints that StageCheckpoint staged and that check out, and
// holds the sandbox's admission claim (paused: its disk). in.Commit runs
// last, with everything in place and the checkpoints taken: the cluster
// switches the records' owner to this node there. If receive, Moved or
// commit fails, nothing of the sandbox or its checkpoints is left here.
// Afterwards a Wake here resumes it as one paused here.
func (mv *Moves) MoveIn(ctx context.Context, in Incoming) (err error) {
	sb := in.Sandbox
	mover, err := mv.mover()
	if err != nil {
		return err
	}
	if sb == nil || !validSandboxID(sb.ID) {
		return errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "moving in: not a sandbox id")
	}
	if sb.State != StatePaused {
		return notPausedForMove(sb)
	}
	unlock := mv.host.lockOp(sb.ID)
	defer unlock()
	final := mv.files.dir(sb.ID)
	live := mv.host.liveInstance(sb.ID) != nil
	if _, err := os.Lstat(final); live || !errors.Is(err, os.ErrNotExist) {
		return errdefs.New(errdefs.ErrConflict, "already_on_node", "sandbox %s already has files on this node", sb.ID)
	}
	if err := mv.admitMoved(sb); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			mv.ledger.Release(sb.ID)
		}
	}()
	if err := os.MkdirAll(mv.incomingDir(), 0o700); err != nil {
		return fmt.Errorf("moving in sandbox %s: %w", sb.ID, err)
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return fmt.Errorf("moving in sandbox %s: %w", sb.ID, err)
	}
	staging, err := os.MkdirTemp(mv.incomingDir(), sb.ID+"-")
	if err != nil {
		return fmt.Errorf("moving in sandbox %s: %w", sb.ID, err)
	}
	left := staging // what a failure removes
	defer func() {
		if err != nil {
			_ = os.RemoveAll(mv.checkpointStage(sb.ID))
			if rerr := removeAll(left); rerr != nil {
				mv.log.Warn("removing the files of a failed move", "sandbox_id", sb.ID, "err", rerr)
			}
		}
	}()
	if err := in.Receive(ctx, staging); err != nil {
		return fmt.Errorf("moving in sandbox %s: receiving its files: %w", sb.ID, err)
	}
	// In place before Moved: the disk chain names the files where they
	// stay.
	if err := os.Rename(staging, final); err != nil {
		return fmt.Errorf("moving in sandbox %s: %w", sb.ID, err)
	}
	left = final
	spec := mv.files.vmSpec(sb)
	if err := mover.Moved(ctx, spec); err != nil {
		return fmt.Errorf("moving in sandbox %s: %w", sb.ID, err)
	}
	if !mv.driver.Saved(spec) {
		return fmt.Errorf("moving in sandbox %s: its saved state did not arrive", sb.ID)
	}
	taken, undo := mv.takeCheckpoints(ctx, sb, in.Checkpoints)
	if err := in.Commit(ctx, taken); err != nil {
		undo()
		return fmt.Errorf("moving in sandbox %s: %w", sb.ID, err)
	}
	// The commit records the move's event, with both nodes, in its
	// transaction.
	mv.log.Info("paused sandbox moved to this node", "sandbox_id", sb.ID, "checkpoints", len(taken))
	mv.waiters.notify(sb.ID)
	return nil
}

// moving reports whether sandbox id is a running one paused or woken for
// a move: calls into it get the retryable sandbox_moving meanwhile.
func (mv *Moves) moving(id string) bool {
	if mv == nil {
		return false
	}
	mv.mu.Lock()
	defer mv.mu.Unlock()
	return mv.movingIDs[id]
}

// Moving counts the running sandboxes paused or woken for a move here now.
func (mv *Moves) Moving() int {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	return len(mv.movingIDs)
}

func (mv *Moves) setMoving(id string, on bool) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if on {
		mv.movingIDs[id] = true
	} else {
		delete(mv.movingIDs, id)
	}
}

// errMoving answers a call into a sandbox that is moving: retry in a
// second, when it runs on its new node.
func errMoving(id string) error {
	e := errdefs.New(errdefs.ErrUnavailable, "sandbox_moving", "sandbox %s is moving to another node", id).
		WithHint("retry: it runs again within seconds")
	e.RetryAfter = time.Second
	return e
}

// PauseForMove pauses the running sandbox id so that MoveOut can hand it
// to another node, and returns once it is paused. From then until EndMove
// calls into it get the retryable sandbox_moving. A sandbox holding
// volumes is refused before it is paused.
func (mv *Moves) PauseForMove(ctx context.Context, id string) error {
	sb, err := mv.records.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if sb.State != StateRunning {
		return errdefs.New(errdefs.ErrConflict, "not_running", "sandbox %s is %s, not running", id, sb.State.Wire())
	}
	if mv.volumes != nil && mv.volumes.Holds(ctx, id) {
		return errdefs.New(errdefs.ErrConflict, "volumes_attached",
			"sandbox %s holds volumes; only a sandbox with no volumes can move to another node", id)
	}
	mv.setMoving(id, true)
	paused := false
	defer func() {
		if !paused {
			mv.setMoving(id, false)
		}
	}()
	mv.settle(ctx, id)
	if _, err := mv.pause(ctx, id); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, pauseTimeout)
	defer cancel()
	sb, err = mv.waitFor(wctx, sb.OwnerKeyID, id, StatePaused, StateRunning, StateStopped, StateDeleted)
	if err != nil {
		return fmt.Errorf("pausing sandbox %s to move it: %w", id, err)
	}
	if sb.State != StatePaused {
		return fmt.Errorf("pausing sandbox %s to move it: it is %s", id, sb.State.Wire())
	}
	paused = true
	return nil
}

// settleTimeout bounds how long a move waits for the calls in flight in a
// sandbox to end before it pauses it (a longer one is cut, as a pause
// cuts it).
const settleTimeout = 10 * time.Second

// settle waits, up to settleTimeout, for the calls in flight in sandbox
// id to end; new ones are refused (moving) meanwhile.
func (mv *Moves) settle(ctx context.Context, id string) {
	in := mv.host.liveInstance(id)
	if in == nil {
		return
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	deadline := time.After(settleTimeout)
	for in.working() {
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			mv.log.Warn("moving a running sandbox: calls still in flight are cut by its pause", "sandbox_id", id)
			return
		case <-t.C:
		}
	}
}

// BeginMove marks sandbox id as moving here (its files arriving, to be
// woken): calls into it get sandbox_moving until EndMove.
func (mv *Moves) BeginMove(id string) { mv.setMoving(id, true) }

// WakeMoved wakes the sandbox id, paused for a move (here, where it moved,
// or back on the node it left when the move failed), with the lease it
// had, and returns once it runs.
func (mv *Moves) WakeMoved(ctx context.Context, id string) error {
	mv.setMoving(id, true)
	defer mv.setMoving(id, false)
	sb, err := mv.wake(ctx, id)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, mv.bootTimeout+5*time.Second)
	defer cancel()
	sb, err = mv.waitFor(wctx, sb.OwnerKeyID, id, StateRunning, StatePaused, StateStopped, StateDeleted)
	if err != nil {
		return fmt.Errorf("waking moved sandbox %s: %w", id, err)
	}
	if sb.State != StateRunning {
		return fmt.Errorf("waking moved sandbox %s: it is %s", id, sb.State.Wire())
	}
	return nil
}

// EndMove ends what PauseForMove began here: the sandbox moved away, or
// was woken here again.
func (mv *Moves) EndMove(id string) { mv.setMoving(id, false) }

// admitMoved holds the disk of a paused sandbox moving here, if this node
// has room for it. Its owner's quota is not checked again: the sandbox was
// admitted when it was created, and a move takes nothing more. So the room
// is checked under no owner's name, and the claim then held under its own.
func (mv *Moves) admitMoved(sb *Sandbox) error {
	c := claim(sb)
	anon := c
	anon.Owner = ""
	if err := mv.ledger.Reserve(anon); err != nil {
		return err
	}
	mv.ledger.Restore(c) // in place of anon's
	return nil
}

// mover is the driver's vmm.Mover, or the refusal of a driver without one.
func (mv *Moves) mover() (vmm.Mover, error) {
	if mv, ok := mv.driver.(vmm.Mover); ok {
		return mv, nil
	}
	return nil, errdefs.New(errdefs.ErrUnavailable, "move_unsupported",
		"the %s driver cannot move a paused sandbox to another node", mv.driver.Name())
}

// errNotOnNode refuses to act on a paused sandbox whose files are on
// another node.
func errNotOnNode(id string) error {
	return errdefs.New(errdefs.ErrConflict, "not_on_node", "sandbox %s is paused on another node", id)
}

func notPausedForMove(sb *Sandbox) error {
	e := errdefs.New(errdefs.ErrConflict, "not_paused", "sandbox %s is %s, not paused", sb.ID, sb.State.Wire()).
		WithHint("only a paused sandbox can move to another node")
	e.Details = map[string]any{"state": string(sb.State.Wire())}
	return e
}

// validSandboxID reports whether id is one newID makes ("sbx_" and 20
// lowercase hex digits): a moving sandbox's id names a directory here.
func validSandboxID(id string) bool { return validID(id, "sbx_") }

// validCheckpointID reports whether id is one a checkpoint gets ("ckpt_"
// and 20 lowercase hex digits): a moving checkpoint's id names a directory
// here.
func validCheckpointID(id string) bool { return validID(id, "ckpt_") }

// validID reports whether id is prefix and 20 lowercase hex digits.
func validID(id, prefix string) bool {
	if len(id) != len(prefix)+20 || id[:len(prefix)] != prefix {
		return false
	}
	for _, c := range id[len(prefix):] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// removeIncoming removes what moves cut short by a crash left in the
// staging directory.
func (mv *Moves) removeIncoming() {
	if err := os.RemoveAll(mv.incomingDir()); err != nil {
		mv.log.Warn("removing the files of moves cut short", "err", err)
	}
}
