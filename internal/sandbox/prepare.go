package sandbox

import (
	"context"
	"fmt"

	"github.com/emberbox/emberbox/internal/guest"
)

// A Preparer readies a freshly started sandbox before it is reported
// running: volumes to attach, an image's start command to run. It is called
// once the agent answers, after a boot, a copy of a snapshot or a template,
// and again for a sandbox that was starting when the server restarted, so
// it must be safe to repeat. g is the sandbox's guest; sb its record.
type Preparer interface {
	// Name says what it prepares, for events and errors.
	Name() string
	Prepare(ctx context.Context, sb *Sandbox, g guest.Handle) error
}

// prepareReady runs the preparers on a sandbox whose agent answers, then
// records it running. A preparer's error stops the sandbox as start_failed
// with a prepare_failed event naming it; a stop or delete meanwhile (ctx
// done) leaves the end to that path.
func (m *Manager) prepareReady(ctx context.Context, in *instance, sb *Sandbox, data map[string]any) {
	if len(m.cfg.Preparers) > 0 {
		c := in.guest()
		if c == nil {
			m.spawn(func() { _, _ = m.stop(m.ctx, sb.ID, ReasonStartFailed, false) })
			return
		}
		g := activeGuest{Client: c, touch: func() { in.touch(m.now()) }}.handle()
		for _, p := range m.cfg.Preparers {
			if err := p.Prepare(ctx, sb, g); err != nil {
				if ctx.Err() != nil || m.closing.Load() {
					return
				}
				m.log.Warn("preparing a sandbox failed", "sandbox_id", sb.ID, "preparer", p.Name(), "err", err)
				m.event(sb.ID, "prepare_failed", fmt.Sprintf("%s: %v", p.Name(), err), map[string]any{"preparer": p.Name()})
				// The VM runs: stop it as a stop of a starting sandbox does
				// (asynchronously: the stop waits for this boot to end).
				m.spawn(func() { _, _ = m.stop(m.ctx, sb.ID, ReasonStartFailed, false) })
				return
			}
		}
	}
	in.steps.mark("prepare")
	m.ready(in, data)
}
