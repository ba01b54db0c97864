package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/vmm"
)

// Recover accounts for every sandbox the store says is live, after a start
// of the server (clean or after a crash): a VM that still runs is reattached
// and keeps its state; one that does not is recorded as stopped with reason
// lost_on_restart. A sandbox that was still booting gets one more boot
// timeout for its agent to answer; one that was stopping is stopped; one
// that was being deleted is deleted. Leases that ended meanwhile are
// enforced by the next tick of Run.
func (m *Manager) Recover(ctx context.Context) error {
	m.Moves.removeIncoming() // moves cut short: their old node still has them
	m.Snapshots.FailInterrupted(ctx)
	live, err := m.cfg.Store.ListLive(ctx)
	if err != nil {
		return fmt.Errorf("listing live sandboxes: %w", err)
	}
	// What the last process promised is held again before anything is
	// decided; a sandbox found gone is released when it is marked stopped.
	for _, sb := range live {
		m.cfg.Admission.Restore(claim(sb))
	}
	for _, sb := range live {
		m.recoverOne(ctx, sb)
	}
	return m.finishDeletes(ctx)
}

func (m *Manager) recoverOne(ctx context.Context, sb *Sandbox) {
	log := m.log.With("sandbox_id", sb.ID)
	sb = m.recoverSwitch(ctx, sb)
	if sb.State == StatePaused {
		return // no VM; its saved state and disk are in its dir
	}
	var mach vmm.Machine
	var err error
	if len(sb.VM) > 0 {
		mach, err = m.cfg.Driver.Attach(ctx, m.files.vmSpec(sb), sb.VM)
	} else {
		err = vmm.ErrGone
	}
	if err != nil {
		m.recoverGone(ctx, sb, err)
		return
	}
	if sb.State == StateResuming && m.cfg.Driver.Saved(m.files.vmSpec(sb)) {
		// A VM that runs beside a saved state it has not used: the saved
		// state is the truth; this VM may not have gone far enough to be.
		log.Info("ending a vm of an interrupted wake; its saved state stays")
		if err := mach.Stop(ctx); err != nil {
			log.Warn("stopping the vm of an interrupted wake", "err", err)
		}
		m.recordPaused(sb.ID)
		return
	}
	in := newInstance(m.ctx, sb.ID)
	in.machine = mach
	if sb.State != StateStarting {
		close(in.bootDone)
	}
	in.gate = m.gates.restore(ctx, sb.ID)
	m.mu.Lock()
	m.live[sb.ID] = in
	m.mu.Unlock()
	log.Info("reattached to running vm", "pid", mach.PID(), "state", sb.State)
	m.event(sb.ID, "reattached", "server restarted; vm still running", map[string]any{"pid": mach.PID()})
	var started bool
	switch sb.State {
	case StateDeleting:
		started = m.spawn(func() {
			if _, err := m.finishDelete(m.ctx, sb.ID); err != nil {
				m.log.Error("finishing delete", "err", err)
			}
		})
	case StateStopping:
		started = m.spawn(func() { _, _ = m.stop(m.ctx, sb.ID, sb.StopReason, true) })
	case StateStarting:
		started = m.spawn(func() { m.resumeBoot(in.ctx, in, sb) })
	case StatePausing:
		started = m.spawn(func() { m.finishPause(sb.ID, "recovered") })
	case StateResuming:
		started = m.spawn(func() { m.continueWake(in, sb) })
	default:
		started = m.spawn(func() { m.watch(in) })
	}
	if !started && sb.State == StateStarting {
		close(in.bootDone)
	}
}

// recoverGone accounts for a live sandbox whose VM could not be
// reattached (err): a pause or wake cut short is paused if its state was
// saved, a delete is finished, and anything else is stopped.
func (m *Manager) recoverGone(ctx context.Context, sb *Sandbox, err error) {
	log := m.log.With("sandbox_id", sb.ID)
	if !errors.Is(err, vmm.ErrGone) {
		log.Warn("reattaching", "err", err)
	}
	// A boot cut short by a crash may have left a VM that no record
	// names (its record was not yet saved): end it.
	if k, ok := m.cfg.Driver.(vmm.StrayKiller); ok {
		if n, err := k.KillStray(ctx, m.files.vmSpec(sb)); err != nil {
			log.Warn("ending stray vm", "err", err)
		} else if n > 0 {
			log.Info("ended stray vm left by an interrupted boot", "count", n)
		}
	}
	if (sb.State == StatePausing || sb.State == StateResuming) && m.cfg.Driver.Saved(m.files.vmSpec(sb)) {
		// The pause got as far as saving, or the wake not as far as
		// using the saved state: paused either way.
		log.Info("recording an interrupted pause or wake paused", "state", sb.State)
		m.recordPaused(sb.ID)
		return
	}
	if sb.State == StateDeleting {
		log.Info("finishing an interrupted delete")
		m.spawn(func() {
			if _, err := m.finishDelete(m.ctx, sb.ID); err != nil {
				m.log.Error("finishing delete", "err", err)
			}
		})
		return
	}
	log.Info("sandbox's vm is gone; marking it stopped")
	// Its counters went with it: what it used since the last settle
	// is lost, and nothing more is charged.
	if err := m.cfg.Meter.DropMeter(ctx, sb.ID); err != nil {
		log.Warn("dropping the meter of a lost vm", "err", err)
	}
	m.markStopped(sb.ID, ReasonLostOnRestart)
}

// finishDeletes completes deletions that a server older than the deleting
// state left half done: a sandbox stopped on its way to deletion still has
// its disk.
func (m *Manager) finishDeletes(ctx context.Context) error {
	opts := ListOptions{States: []State{StateStopped}, IncludeStopped: true, Limit: 100, Local: true}
	for {
		page, next, err := m.cfg.Store.ListSandboxes(ctx, opts)
		if err != nil {
			return fmt.Errorf("listing stopped sandboxes: %w", err)
		}
		for _, sb := range page {
			pending := sb.StopReason == ReasonDeleted ||
				(sb.StopReason == ReasonLeaseExpired && sb.OnLeaseEnd == LeaseEndDelete)
			if sb.DeletedAt != nil || !pending {
				continue
			}
			m.log.Info("finishing an interrupted delete", "sandbox_id", sb.ID)
			if _, err := m.delete(ctx, sb.ID, sb.StopReason); err != nil {
				m.log.Error("finishing delete", "sandbox_id", sb.ID, "err", err)
			}
		}
		if next == "" {
			return nil
		}
		opts.Cursor = next
	}
}

// resumeBoot waits for the agent of a VM that was booting when the server
// went away; the environment was not yet sent, so a sandbox created with env
// cannot be completed and is stopped instead.
func (m *Manager) resumeBoot(ctx context.Context, in *instance, sb *Sandbox) {
	defer close(in.bootDone)
	if len(sb.EnvNames) > 0 {
		m.spawn(func() { _, _ = m.stop(m.ctx, sb.ID, ReasonStartFailed, false) })
		return
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	defer cancel()
	plan := bootPlan{in: in, mach: in.machine, ready: configure(agentproto.ConfigureRequest{CACerts: m.cfg.ExtraCAs})}
	if _, err := m.bootGuest(ctx, plan); err != nil {
		if m.closing.Load() {
			return // shutting down: the next start resumes this boot again
		}
		m.spawn(func() { _, _ = m.stop(m.ctx, sb.ID, ReasonStartFailed, false) })
		return
	}
	m.prepareReady(in.ctx, in, sb, map[string]any{"resumedAfterRestart": true})
}

// continueWake goes on with a wake a crash of the server cut short after
// the saved state was used: the VM runs (maybe stopped by its VMM before
// the guest went on), so it is let run, renewed and recorded running.
func (m *Manager) continueWake(in *instance, sb *Sandbox) {
	unlock := m.lockOp(sb.ID)
	defer unlock()
	ctx, cancel := context.WithTimeout(in.ctx, m.cfg.BootTimeout)
	defer cancel()
	if err := vmm.Continue(ctx, in.machine); err != nil {
		m.log.Warn("letting a resumed vm run after a restart", "sandbox_id", sb.ID, "err", err)
	}
	if _, err := m.bootGuest(ctx, bootPlan{in: in, mach: in.machine, restored: true}); err != nil {
		m.wakeFailed(in, sb, in.machine, err)
		return
	}
	m.running(in, "woken", map[string]any{"resumedAfterRestart": true})
}
