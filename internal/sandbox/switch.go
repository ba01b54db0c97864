package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/faultpoint"
	"github.com/emberbox/emberbox/internal/vmm"
)

// A switch of image moves a sandbox to another image's disk, keeping its
// id, record, /workspace and volumes (D-numbered in docs/DESIGN.md). The
// old VM is paused, not stopped, and its files are kept aside until the
// new VM runs: a switch that fails resumes the old VM from its saved
// memory, so nothing of it is lost.
//
// The files of a switch under way live in <dir>.switch: switch.json (the
// old and new image), workspace.tar (the spooled /workspace) and old/ (the
// old VM's whole directory, moved there once it is paused). Recover undoes
// a switch a crash cut short while old/ is there (switch.json is removed
// at the commit, right after the record names the new image).

// SwitchKeepWorkspace is the only "keep" of a switch.
const SwitchKeepWorkspace = "workspace"

const (
	switchWorkspace   = "/workspace"
	switchMarkerFile  = "switch.json"
	switchSpoolFile   = "workspace.tar"
	switchOldDir      = "old"
	switchSpoolSlack  = 64 << 20 // tar headers and padding beyond the disk's bytes
	switchCopyTimeout = 10 * time.Minute
)

// switchMarker names the images of a switch under way.
type switchMarker struct {
	OldImageID string `json:"oldImageId"`
	OldRootfs  string `json:"oldRootfs"`
	NewImageID string `json:"newImageId"`
	NewRootfs  string `json:"newRootfs"`
}

// switchDir holds the files of a switch of the sandbox whose directory is
// dir.
func switchDir(dir string) string { return dir + ".switch" }

// Switcher moves sandboxes to another image (SwitchImage) and carries
// their /workspace across. The switch itself, under the sandbox's VM lock,
// is a transition of the manager (switchLocked), which it reaches through
// switchHost; Manager.Switcher returns the manager's.
type Switcher struct {
	host        switchHost
	volumes     Volumes       // nil: no sandbox holds volumes
	bootTimeout time.Duration // how long a sandbox starting may take to run
	outcomes    outcomes
	envs        *envMemory // a switch needs the env values to carry them over
}

// switchHost is what a switch needs of the manager: a sandbox as its owner
// sees it, brought to running, and the switch under the VM lock.
type switchHost interface {
	Get(ctx context.Context, owner, id string) (*Sandbox, error)
	WaitFor(ctx context.Context, owner, id string, states ...State) (*Sandbox, error)
	Wake(ctx context.Context, owner, id string, timeout *int) (*Sandbox, error)
	Restart(ctx context.Context, owner, id string) (*Sandbox, error)
	switchLocked(ctx context.Context, id string, to switchMarker) (_ *Sandbox, done bool, err error)
}

func switchUndone(id, why string) error {
	return errdefs.New(errdefs.ErrConflict, "switch_undone",
		"the switch of sandbox %s's image was undone: %s", id, why).
		WithHint("the sandbox is on its old image with its files and processes as they were; fix the cause and switch again")
}

func imageName(id string) string {
	if id == "" {
		return "default"
	}
	return id
}

// SwitchImage moves the sandbox to
// img (nil: the server's default image), keeping /workspace and its
// volumes, and answers once it runs there. A paused or stopped sandbox is
// woken or restarted first, to read its /workspace. A failure after the
// old VM was paused is undone (switch_undone): the old VM resumes.
func (sw *Switcher) SwitchImage(ctx context.Context, owner, id string, img *ImageRef) (_ *Sandbox, err error) {
	defer func() { sw.outcomes.op("switch_image", err) }()
	sb, err := sw.host.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	to := switchMarker{}
	if img != nil {
		if img.Rootfs == "" {
			return nil, fmt.Errorf("switch: image %s has no root disk", img.ID)
		}
		if sb.DiskMiB < img.MinDiskMiB {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request",
				"image: image %s needs a disk of at least %d MiB; sandbox %s has %d MiB", img.ID, img.MinDiskMiB, id, sb.DiskMiB).
				WithHint("create a sandbox with a larger diskMiB on that image")
		}
		to.NewImageID, to.NewRootfs = img.ID, img.Rootfs
	}
	if _, known := sw.envs.known(id); !known && len(sb.EnvNames) > 0 {
		return nil, envUnavailable("this server no longer knows the values of the sandbox's environment (it restarted), so a new VM of it would lose them")
	}
	for range 3 {
		if err := sw.upForSwitch(ctx, owner, id); err != nil {
			return nil, err
		}
		sb, done, err := sw.host.switchLocked(ctx, id, to)
		if done || err != nil {
			return sb, err
		}
		// It paused or stopped between coming up and the lock: again.
	}
	sb, err = sw.host.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return nil, errdefs.New(errdefs.ErrConflict, "sandbox_busy", "sandbox %s kept changing state (%s) during its switch of image", id, sb.State.Wire()).
		WithHint("try again")
}

// upForSwitch brings the sandbox to running: woken if paused, restarted
// from its kept disk if stopped.
func (sw *Switcher) upForSwitch(ctx context.Context, owner, id string) error {
	sb, err := sw.host.Get(ctx, owner, id)
	if err != nil {
		return err
	}
	switch sb.State {
	case StateRunning:
		return nil
	case StatePaused:
		_, err = sw.host.Wake(ctx, owner, id, nil)
	case StateStopped:
		_, err = sw.host.Restart(ctx, owner, id)
	case StateStarting, StateResuming, StatePausing:
	default:
		return Refusal(sb)
	}
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, pauseTimeout+2*sw.bootTimeout)
	defer cancel()
	sb, err = sw.host.WaitFor(wctx, owner, id, StateRunning, StatePaused)
	if err != nil {
		return err
	}
	if sb.State == StatePaused {
		// A pause under way finished, or the wake failed: the next round
		// wakes it (again).
		return nil
	}
	if sb.State != StateRunning {
		if r := Refusal(sb); r != nil {
			return r
		}
		return errdefs.New(errdefs.ErrConflict, "sandbox_busy", "sandbox %s is %s, not running", id, sb.State.Wire())
	}
	return nil
}

// switchLocked does the switch under the sandbox's VM lock; done is false
// when it found the sandbox no longer running (nothing changed).
func (m *Manager) switchLocked(ctx context.Context, id string, to switchMarker) (_ *Sandbox, done bool, err error) {
	unlock := m.lockOp(id)
	defer unlock()
	ctx = context.WithoutCancel(ctx) // a client gone mid-way must not cut the switch short
	sw := &imageSwitch{m: m, id: id, to: to, start: time.Now(), log: m.log.With("sandbox_id", id)}
	sb, err := m.cfg.Store.GetSandbox(ctx, id)
	if err != nil {
		return nil, true, err
	}
	m.mu.Lock()
	old := m.live[id]
	m.mu.Unlock()
	if sb.State != StateRunning || old == nil || old.guest() == nil {
		return nil, false, nil
	}
	sw.to.OldImageID, sw.to.OldRootfs = sb.ImageID, sb.Rootfs
	sw.env, _ = m.envs.known(id)
	sw.sdir = switchDir(m.files.dir(id))

	// 1. /workspace to the spool, while the old VM runs.
	if err := sw.spool(ctx, old, sb); err != nil {
		return nil, true, err
	}
	faultpoint.Hit("switch.spooled")

	// 2. Pause the old VM (volumes flushed first: the new VM mounts them).
	m.volumes.sync(id, old.guest())
	if paused, err := sw.markPausing(ctx); err != nil || !paused {
		_ = os.RemoveAll(sw.sdir)
		return nil, err != nil, err
	}
	if !m.pauseLocked(id, "switch_image", false) {
		return sw.pauseFailed(ctx)
	}
	faultpoint.Hit("switch.paused")

	// 3. The old VM's files aside, the record starting on the new image.
	if err := sw.setAside(ctx); err != nil {
		return m.undoSwitch(id, nil, sw.sdir, err)
	}

	// 4. Boot the new image, as a create does (two tries).
	sw.next = *sb
	sw.next.ImageID, sw.next.Rootfs, sw.next.State = sw.to.NewImageID, sw.to.NewRootfs, StateStarting
	in, err := sw.bootNew(ctx)
	if err != nil {
		return m.undoSwitch(id, in, sw.sdir, err)
	}
	faultpoint.Hit("switch.booted")

	// 5. /workspace into it, its volumes, its start command.
	if err := sw.prepareNew(ctx, in); err != nil {
		return m.undoSwitch(id, in, sw.sdir, err)
	}

	// 6. Commit: the record names the new image; then the old files go.
	return sw.commit(ctx, in)
}

// imageSwitch is one switch of image under way, in the steps of
// switchLocked, which holds the sandbox's VM lock throughout.
type imageSwitch struct {
	m     *Manager
	id    string
	to    switchMarker
	start time.Time
	log   *slog.Logger

	env  map[string]string // the values of the sandbox's environment, if known
	sdir string            // the switch's spool: marker, /workspace tar, old files
	size int64             // of the /workspace tar
	next Sandbox           // the record as the new VM boots
}

// spool writes /workspace to the spool while the old VM runs; an error
// is the switch's answer, nothing having changed.
func (sw *imageSwitch) spool(ctx context.Context, old *instance, sb *Sandbox) error {
	_ = os.RemoveAll(sw.sdir)
	size, err := sw.m.Switcher.spoolWorkspace(ctx, old, sb, sw.sdir, sw.to)
	if err != nil {
		_ = os.RemoveAll(sw.sdir)
		sw.log.Warn("switch of image: reading /workspace failed", "err", err)
		sw.m.event(sw.id, "switch_undone", "reading /workspace failed: "+err.Error(), map[string]any{"imageId": sw.to.NewImageID})
		return switchUndone(sw.id, "reading its /workspace failed: "+err.Error())
	}
	sw.size = size
	return nil
}

// markPausing records the running sandbox as pausing; paused is false if
// it no longer runs.
func (sw *imageSwitch) markPausing(ctx context.Context) (paused bool, err error) {
	now := sw.m.now()
	_, err = sw.m.update(ctx, sw.id, func(s *Sandbox) bool {
		if paused = s.State == StateRunning; paused {
			s.State, s.PausedAt = StatePausing, &now
		}
		return paused
	})
	return paused && err == nil, err
}

// pauseFailed answers a switch whose old VM could not be paused.
func (sw *imageSwitch) pauseFailed(ctx context.Context) (*Sandbox, bool, error) {
	_ = os.RemoveAll(sw.sdir)
	sb, _ := sw.m.cfg.Store.GetSandbox(ctx, sw.id)
	state := ""
	if sb != nil {
		state = string(sb.State.Wire())
	}
	sw.m.event(sw.id, "switch_undone", "pausing the old vm failed", map[string]any{"imageId": sw.to.NewImageID})
	return sb, true, switchUndone(sw.id, "pausing its old VM failed; it is "+state)
}

// setAside moves the old VM's files into the spool and records the
// sandbox as starting on its new image.
func (sw *imageSwitch) setAside(ctx context.Context) error {
	if err := os.Rename(sw.m.files.dir(sw.id), filepath.Join(sw.sdir, switchOldDir)); err != nil {
		return fmt.Errorf("keeping the old disk: %w", err)
	}
	faultpoint.Hit("switch.moved")
	starting := false
	if _, err := sw.m.update(ctx, sw.id, func(s *Sandbox) bool {
		if starting = s.State == StatePausing; starting {
			s.State, s.VM = StateStarting, nil
		}
		return starting
	}); err != nil || !starting {
		if err == nil {
			err = errors.New("the sandbox was stopped or deleted meanwhile")
		}
		return err
	}
	return nil
}

// bootNew boots the new image as a create does (two tries); it returns
// the new instance, live in the manager, even when the boot failed.
func (sw *imageSwitch) bootNew(ctx context.Context) (*instance, error) {
	m := sw.m
	in := newInstance(m.ctx, sw.id)
	in.gate = m.gates.restore(ctx, sw.id)
	m.mu.Lock()
	m.live[sw.id] = in
	m.mu.Unlock()
	var bootErr error
	for attempt := 1; attempt <= 2; attempt++ {
		if bootErr = m.bootOnce(in.ctx, in, &sw.next, sw.env, false); bootErr == nil {
			break
		}
		sw.log.Warn("switch of image: boot attempt failed", "attempt", attempt, "err", bootErr)
		m.event(sw.id, "boot_failed", bootErr.Error(), map[string]any{"attempt": attempt, "imageId": sw.to.NewImageID})
		if in.ctx.Err() != nil {
			break
		}
	}
	close(in.bootDone)
	if bootErr != nil {
		return in, fmt.Errorf("the new image did not boot: %w", bootErr)
	}
	return in, nil
}

// prepareNew puts /workspace into the new VM, mounts the sandbox's
// volumes again and runs the preparers (its start command).
func (sw *imageSwitch) prepareNew(ctx context.Context, in *instance) error {
	m := sw.m
	if err := m.Switcher.restoreWorkspace(ctx, in, sw.sdir, sw.size); err != nil {
		return err
	}
	g := activeGuest{Client: in.guest(), touch: func() { in.touch(m.now()) }}.handle()
	if r, ok := m.cfg.Volumes.(VolumeReattacher); ok && m.cfg.Volumes.Holds(ctx, sw.id) {
		if err := r.Reattach(ctx, sw.id, g); err != nil {
			return fmt.Errorf("mounting its volumes: %w", err)
		}
	}
	for _, p := range m.cfg.Preparers {
		if err := p.Prepare(ctx, &sw.next, g); err != nil {
			return fmt.Errorf("%s: %w", p.Name(), err)
		}
	}
	return nil
}

// commit records the new image, then removes the old files; the sandbox
// runs on unless a stop came meanwhile.
func (sw *imageSwitch) commit(ctx context.Context, in *instance) (*Sandbox, bool, error) {
	m, id, to := sw.m, sw.id, sw.to
	now := m.now()
	committed, running := false, false
	sb, err := m.update(ctx, id, func(s *Sandbox) bool {
		if s.State == StateDeleting || s.State == StateDeleted {
			return false
		}
		committed = true
		s.ImageID, s.Rootfs = to.NewImageID, to.NewRootfs
		if running = s.State == StateStarting; running {
			s.State, s.ReadyAt, s.PausedAt, s.ExpiresAt = StateRunning, &now, nil, m.cfg.Limits.leaseEnd(s, now)
		}
		return true
	})
	if err != nil || !committed {
		if err == nil {
			err = errors.New("the sandbox was deleted meanwhile")
		}
		return m.undoSwitch(id, in, sw.sdir, err)
	}
	_ = os.Remove(filepath.Join(sw.sdir, switchMarkerFile)) // the switch is done: Recover no longer undoes it
	faultpoint.Hit("switch.committed")
	if err := removeAll(sw.sdir); err != nil {
		sw.log.Warn("switch of image: removing the old disk", "err", err)
	}
	took := time.Since(sw.start)
	data := map[string]any{"from": imageName(to.OldImageID), "to": imageName(to.NewImageID),
		"workspaceBytes": sw.size, "switchMs": took.Milliseconds()}
	sw.log.Info("sandbox switched image", "from", imageName(to.OldImageID), "to", imageName(to.NewImageID), "took", took.Round(time.Millisecond))
	m.event(id, "image_switched", fmt.Sprintf("sandbox switched from image %s to %s", imageName(to.OldImageID), imageName(to.NewImageID)), data)
	if running {
		in.touch(now)
		m.outcomes.ready(data)
		m.spawn(func() { m.watch(in) })
	}
	// Not running: a stop came meanwhile, and its endVM (waiting for the
	// VM lock) ends this VM.
	return sb, true, nil
}

// spoolWorkspace writes the switch's marker and /workspace, read as root,
// as a tar in sdir; it returns the tar's size. The tar is bounded by the
// sandbox's disk; volumes mounted under /workspace are left out (they are
// mounted again, not copied).
func (sw *Switcher) spoolWorkspace(ctx context.Context, in *instance, sb *Sandbox, sdir string, to switchMarker) (int64, error) {
	if err := os.MkdirAll(sdir, 0o700); err != nil {
		return 0, err
	}
	mk, _ := json.Marshal(to)
	if err := os.WriteFile(filepath.Join(sdir, switchMarkerFile), mk, 0o600); err != nil {
		return 0, err
	}
	var exclude []string
	if r, ok := sw.volumes.(VolumeReattacher); ok {
		paths, err := r.Mounts(ctx, sb.ID)
		if err != nil {
			return 0, err
		}
		for _, p := range paths {
			if rel, err := filepath.Rel(switchWorkspace, p); err == nil && rel != "." && filepath.IsLocal(rel) {
				exclude = append(exclude, rel)
			}
		}
	}
	c := in.guest()
	if c == nil {
		return 0, errors.New("the guest is not connected")
	}
	actx, cancel := context.WithTimeout(ctx, switchCopyTimeout)
	defer cancel()
	rc, err := c.Archive(actx, switchWorkspace, "root", false, exclude)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	f, err := os.OpenFile(filepath.Join(sdir, switchSpoolFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	limit := min(int64(sb.DiskMiB)<<20+switchSpoolSlack, agentproto.MaxUnarchive)
	n, err := io.Copy(f, io.LimitReader(rc, limit+1))
	if err != nil {
		return 0, err
	}
	if n > limit {
		return 0, fmt.Errorf("its /workspace is over %d MiB as a tar", limit>>20)
	}
	return n, f.Sync()
}

// restoreWorkspace unpacks the spooled /workspace into the new VM as root
// and gives it to the sandbox user (the agent's unpacking does not keep
// owners; everything under /workspace is the user's, as what it writes
// there is).
func (sw *Switcher) restoreWorkspace(ctx context.Context, in *instance, sdir string, size int64) error {
	c := in.guest()
	if c == nil {
		return errors.New("the new guest is not connected")
	}
	f, err := os.Open(filepath.Join(sdir, switchSpoolFile))
	if err != nil {
		return err
	}
	defer f.Close()
	actx, cancel := context.WithTimeout(ctx, switchCopyTimeout)
	defer cancel()
	if _, err := c.Unarchive(actx, switchWorkspace, "root", size, f); err != nil {
		return fmt.Errorf("writing /workspace into the new image: %w", err)
	}
	res, err := c.Exec(actx, agentproto.ExecRequest{User: "root", TimeoutMs: switchCopyTimeout.Milliseconds(),
		Command: "if id -u user >/dev/null 2>&1; then chown -hR user:user " + switchWorkspace + "; fi"}, nil)
	if err == nil && (res.ExitCode == nil || *res.ExitCode != 0) {
		err = fmt.Errorf("chown: %s", firstLine(res.Stderr))
	}
	if err != nil {
		return fmt.Errorf("giving /workspace to the sandbox user in the new image: %w", err)
	}
	return nil
}

func firstLine(b []byte) string {
	s := string(b)
	for i, r := range s {
		if r == '\n' {
			return s[:i]
		}
	}
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// undoSwitch puts the sandbox back on its old VM after a failed switch:
// the new VM (if any) ends, the record goes back to pausing, the old
// files back in place, and the old VM resumes from its saved memory as a
// wake does. It answers switch_undone with cause.
func (m *Manager) undoSwitch(id string, in *instance, sdir string, cause error) (*Sandbox, bool, error) {
	log := m.log.With("sandbox_id", id)
	log.Warn("switch of image failed; undoing it", "err", cause)
	if in != nil {
		in.cancel()
		if mach := in.vm(); mach != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			if err := mach.Stop(sctx); err != nil {
				log.Warn("stopping the new vm of a failed switch", "err", err)
			}
			cancel()
		}
		m.forget(in)
	}
	// Pausing with no VM first: a crash from here on is undone by Recover
	// (old/ is still aside) or finds the saved state in place.
	if _, err := m.update(context.Background(), id, func(s *Sandbox) bool {
		if s.State != StateStarting {
			return false
		}
		s.State, s.VM = StatePausing, nil
		return true
	}); err != nil {
		log.Error("recording an undone switch", "err", err)
	}
	oldDir := filepath.Join(sdir, switchOldDir)
	if _, err := os.Stat(oldDir); err == nil {
		if err := removeAll(m.files.dir(id)); err != nil {
			log.Error("removing the new disk of a failed switch", "err", err)
		}
		if err := os.Rename(oldDir, m.files.dir(id)); err != nil {
			// Recover tries again at the next start.
			log.Error("putting the old disk back after a failed switch", "err", err)
			return nil, true, fmt.Errorf("undoing the switch of sandbox %s: %w", id, err)
		}
	}
	_ = removeAll(sdir)
	faultpoint.Hit("switch.undone")
	resuming := false
	sb, err := m.update(context.Background(), id, func(s *Sandbox) bool {
		if resuming = s.State == StatePausing; resuming {
			s.State = StateResuming
		}
		return resuming
	})
	if err != nil {
		return nil, true, err
	}
	if resuming {
		m.finishWake(sb) // running again, or paused if it cannot resume
		sb, err = m.cfg.Store.GetSandbox(context.Background(), id)
		if err != nil {
			return nil, true, err
		}
	}
	// Not resuming: a stop or delete came meanwhile and finishes it.
	m.event(id, "switch_undone", cause.Error(), map[string]any{"state": string(sb.State.Wire())})
	return sb, true, switchUndone(id, cause.Error())
}

// recoverSwitch undoes a switch of image a crash cut short, before the
// sandbox is recovered: with the old VM's files aside, any new VM ends,
// the files go back, and the record names the old image, pausing, so that
// the saved state makes it paused. It returns the record to recover.
func (m *Manager) recoverSwitch(ctx context.Context, sb *Sandbox) *Sandbox {
	sdir := switchDir(m.files.dir(sb.ID))
	if _, err := os.Stat(sdir); err != nil {
		return sb
	}
	log := m.log.With("sandbox_id", sb.ID)
	raw, err := os.ReadFile(filepath.Join(sdir, switchMarkerFile))
	var mk switchMarker
	oldDir := filepath.Join(sdir, switchOldDir)
	_, oldErr := os.Stat(oldDir)
	if err != nil || json.Unmarshal(raw, &mk) != nil || oldErr != nil {
		// Committed, or cut short before the old VM's files moved:
		// the sandbox is as its record says.
		_ = removeAll(sdir)
		return sb
	}
	log.Info("undoing a switch of image cut short", "to", imageName(mk.NewImageID))
	if len(sb.VM) > 0 {
		if mach, err := m.cfg.Driver.Attach(ctx, m.files.vmSpec(sb), sb.VM); err == nil {
			if err := mach.Stop(ctx); err != nil {
				log.Warn("stopping the new vm of a switch cut short", "err", err)
			}
		}
	}
	if k, ok := m.cfg.Driver.(vmm.StrayKiller); ok {
		if _, err := k.KillStray(ctx, m.files.vmSpec(sb)); err != nil {
			log.Warn("ending a stray vm of a switch cut short", "err", err)
		}
	}
	if err := removeAll(m.files.dir(sb.ID)); err != nil {
		log.Error("removing the new disk of a switch cut short", "err", err)
		return sb
	}
	if err := os.Rename(oldDir, m.files.dir(sb.ID)); err != nil {
		log.Error("putting the old disk back after a switch cut short", "err", err)
		return sb
	}
	_ = removeAll(sdir)
	got, err := m.update(ctx, sb.ID, func(s *Sandbox) bool {
		if s.State == StateDeleting || s.State == StateDeleted {
			return false
		}
		s.ImageID, s.Rootfs, s.VM = mk.OldImageID, mk.OldRootfs, nil
		if s.State != StateStopping {
			s.State = StatePausing
		}
		return true
	})
	if err != nil {
		log.Error("recording a switch cut short undone", "err", err)
		return sb
	}
	m.event(sb.ID, "switch_undone", "the server restarted during the switch", map[string]any{"imageId": mk.NewImageID})
	return got
}
