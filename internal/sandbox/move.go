package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

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

// incomingDir holds the staging directories of sandboxes moving in; what a
// crash left there is removed at the next start (Recover).
func (m *Manager) incomingDir() string { return filepath.Join(m.cfg.DataDir, "incoming") }

// MoveOut hands the paused sandbox id to another node: under the
// sandbox's VM lock it checks that the sandbox is paused, here, and holds
// no volumes, then calls send with the record and the files that hold it
// (vmm.Mover.MoveFiles: the name each takes in its new directory, mapped
// to its path here). If send returns nil the sandbox is no longer this
// manager's: its admission claim is released, what is kept of it in memory
// forgotten and its directory removed. An error from send leaves it as it
// was, paused here.
func (m *Manager) MoveOut(ctx context.Context, id string, send func(ctx context.Context, sb *Sandbox, files map[string]string) error) error {
	mover, err := m.mover()
	if err != nil {
		return err
	}
	unlock := m.lockOp(id) // no pause, wake or end of a stop or delete meanwhile
	defer unlock()
	sb, err := m.cfg.Store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if sb.State != StatePaused {
		return notPausedForMove(sb)
	}
	spec := m.vmSpec(sb)
	m.mu.Lock()
	_, live := m.live[id]
	m.mu.Unlock()
	if live || !m.cfg.Driver.Saved(spec) || !m.cfg.Admission.Held(id) {
		return errNotOnNode(id)
	}
	if m.cfg.Volumes != nil && m.cfg.Volumes.Holds(ctx, id) {
		return errdefs.New(errdefs.ErrConflict, "volumes_attached",
			"sandbox %s holds volumes; only a sandbox with no volumes can move to another node", id).
			WithHint("detach its volumes first")
	}
	files, err := mover.MoveFiles(spec)
	if err != nil {
		return fmt.Errorf("moving sandbox %s: %w", id, err)
	}
	// Its disk is charged here up to the move, and by the new node after.
	m.meter.accrueKept(ctx, sb, m.now())
	if err := send(ctx, sb, files); err != nil {
		return fmt.Errorf("moving sandbox %s: %w", id, err)
	}
	// The sandbox is the other node's now: nothing of it stays here.
	m.cfg.Admission.Release(id)
	m.rememberEnv(id, nil)
	if err := removeAll(m.dir(id)); err != nil {
		m.log.Warn("removing the files of a sandbox moved to another node", "sandbox_id", id, "err", err)
	}
	m.log.Info("paused sandbox moved to another node", "sandbox_id", id)
	m.notify(id)
	return nil
}

// MoveIn takes in the paused sandbox sb (its record as the old node has
// it) moving here: receive writes its files, named as MoveFiles named
// them, into the empty staging directory it is given; MoveIn then moves
// that directory into place, has the driver make the files resumable there
// (vmm.Mover.Moved) and holds the sandbox's admission claim (paused: its
// disk). commit runs last, with everything in place: the cluster switches
// the record's owner to this node there. If receive, Moved or commit fails,
// nothing of the sandbox is left here. Afterwards a Wake here resumes it
// as one paused here.
func (m *Manager) MoveIn(ctx context.Context, sb *Sandbox, receive func(ctx context.Context, dir string) error, commit func(ctx context.Context) error) (err error) {
	mover, err := m.mover()
	if err != nil {
		return err
	}
	if sb == nil || !validSandboxID(sb.ID) {
		return errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "moving in: not a sandbox id")
	}
	if sb.State != StatePaused {
		return notPausedForMove(sb)
	}
	unlock := m.lockOp(sb.ID)
	defer unlock()
	final := m.dir(sb.ID)
	m.mu.Lock()
	_, live := m.live[sb.ID]
	m.mu.Unlock()
	if _, err := os.Lstat(final); live || !errors.Is(err, os.ErrNotExist) {
		return errdefs.New(errdefs.ErrConflict, "already_on_node", "sandbox %s already has files on this node", sb.ID)
	}
	if err := m.admitMoved(sb); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			m.cfg.Admission.Release(sb.ID)
		}
	}()
	if err := os.MkdirAll(m.incomingDir(), 0o700); err != nil {
		return fmt.Errorf("moving in sandbox %s: %w", sb.ID, err)
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return fmt.Errorf("moving in sandbox %s: %w", sb.ID, err)
	}
	staging, err := os.MkdirTemp(m.incomingDir(), sb.ID+"-")
	if err != nil {
		return fmt.Errorf("moving in sandbox %s: %w", sb.ID, err)
	}
	left := staging // what a failure removes
	defer func() {
		if err != nil {
			if rerr := removeAll(left); rerr != nil {
				m.log.Warn("removing the files of a failed move", "sandbox_id", sb.ID, "err", rerr)
			}
		}
	}()
	if err := receive(ctx, staging); err != nil {
		return fmt.Errorf("moving in sandbox %s: receiving its files: %w", sb.ID, err)
	}
	// In place before Moved: the disk chain names the files where they
	// stay.
	if err := os.Rename(staging, final); err != nil {
		return fmt.Errorf("moving in sandbox %s: %w", sb.ID, err)
	}
	left = final
	spec := m.vmSpec(sb)
	if err := mover.Moved(ctx, spec); err != nil {
		return fmt.Errorf("moving in sandbox %s: %w", sb.ID, err)
	}
	if !m.cfg.Driver.Saved(spec) {
		return fmt.Errorf("moving in sandbox %s: its saved state did not arrive", sb.ID)
	}
	if err := commit(ctx); err != nil {
		return fmt.Errorf("moving in sandbox %s: %w", sb.ID, err)
	}
	// The commit records the move's event, with both nodes, in its
	// transaction.
	m.log.Info("paused sandbox moved to this node", "sandbox_id", sb.ID)
	m.notify(sb.ID)
	return nil
}

// admitMoved holds the disk of a paused sandbox moving here, if this node
// has room for it. Its owner's quota is not checked again: the sandbox was
// admitted when it was created, and a move takes nothing more. So the room
// is checked under no owner's name, and the claim then held under its own.
func (m *Manager) admitMoved(sb *Sandbox) error {
	c := claim(sb)
	anon := c
	anon.Owner = ""
	if err := m.cfg.Admission.Reserve(anon); err != nil {
		return err
	}
	m.cfg.Admission.Restore(c) // in place of anon's
	return nil
}

// mover is the driver's vmm.Mover, or the refusal of a driver without one.
func (m *Manager) mover() (vmm.Mover, error) {
	if mv, ok := m.cfg.Driver.(vmm.Mover); ok {
		return mv, nil
	}
	return nil, errdefs.New(errdefs.ErrUnavailable, "move_unsupported",
		"the %s driver cannot move a paused sandbox to another node", m.cfg.Driver.Name())
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
func validSandboxID(id string) bool {
	const prefix = "sbx_"
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
func (m *Manager) removeIncoming() {
	if err := os.RemoveAll(m.incomingDir()); err != nil {
		m.log.Warn("removing the files of moves cut short", "err", err)
	}
}
