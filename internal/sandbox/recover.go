package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/emberbox/emberbox/internal/vmm"
)

// Recover accounts for every sandbox the store says is live, after a start
// of the server (clean or after a crash): a VM that still runs is reattached
// and keeps its state; one that does not is recorded as stopped with reason
// lost_on_restart. A sandbox that was still booting gets one more boot
// timeout for its agent to answer. Leases that ended meanwhile are enforced
// by the next tick of Run.
func (m *Manager) Recover(ctx context.Context) error {
	live, err := m.cfg.Store.ListLive(ctx)
	if err != nil {
		return fmt.Errorf("listing live sandboxes: %w", err)
	}
	for _, sb := range live {
		log := m.log.With("sandbox_id", sb.ID)
		var mach vmm.Machine
		if len(sb.VM) > 0 {
			mach, err = m.cfg.Driver.Attach(ctx, m.vmSpec(sb), sb.VM)
		} else {
			err = vmm.ErrGone
		}
		if err != nil {
			if !errors.Is(err, vmm.ErrGone) {
				log.Warn("reattaching", "err", err)
			}
			log.Info("sandbox's vm is gone; marking it stopped")
			m.finish(newInstance(sb.ID), ReasonLostOnRestart)
			continue
		}
		in := newInstance(sb.ID)
		in.machine = mach
		in.gate = m.restoreGate(ctx, sb.ID)
		m.mu.Lock()
		m.live[sb.ID] = in
		m.mu.Unlock()
		log.Info("reattached to running vm", "pid", mach.PID(), "state", sb.State)
		m.event(sb.ID, "reattached", "server restarted; vm still running", map[string]any{"pid": mach.PID()})
		switch sb.State {
		case StateStopping:
			go func() { _, _ = m.stop(context.Background(), sb.ID, sb.StopReason, true) }()
		case StateStarting:
			go m.resumeBoot(in.ctx, in, sb)
		default:
			go m.watch(in)
		}
	}
	return nil
}

// resumeBoot waits for the agent of a VM that was booting when the server
// went away; the environment was not yet sent, so a sandbox created with env
// cannot be completed and is stopped instead.
func (m *Manager) resumeBoot(ctx context.Context, in *instance, sb *Sandbox) {
	if len(sb.EnvNames) > 0 {
		_, _ = m.stop(context.Background(), sb.ID, ReasonStartFailed, false)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	defer cancel()
	c, err := m.connect(ctx, in, in.machine)
	if err != nil {
		_, _ = m.stop(context.Background(), sb.ID, ReasonStartFailed, false)
		return
	}
	in.mu.Lock()
	in.client = c
	in.mu.Unlock()
	m.ready(in, map[string]any{"resumedAfterRestart": true})
}
