package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/faultpoint"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/vmm"
)

// A bootPlan is one way a VM comes up to an agent that answers. bootGuest
// runs every one of them:
//
//   - a cold boot (create, restart, a disk snapshot's copy): boot, bootOnce;
//   - a copy of a template or of a memory snapshot (create, fork):
//     bootTemplate, bootCopy, resumeCopy;
//   - a wake: finishWake;
//   - a VM found booting or waking after a restart of the server:
//     resumeBoot, continueWake;
//   - a template's build: Templates.build.
//
// The caller undoes a failure, as only it knows whether the VM is to stop,
// pause again or stay for the next process of the server.
type bootPlan struct {
	// in is the sandbox's instance: it gets the machine once started and
	// the client once ready. nil for a template's build VM, which has no
	// sandbox: its guest gets a bare handshake (no egress, no watch for
	// violations, no info call).
	in *instance
	// start starts the VM (Driver.Start, Driver.Resume); nil means mach
	// runs already.
	start func(ctx context.Context) (vmm.Machine, error)
	mach  vmm.Machine
	// started and recorded are fault points, hit once the VM has started
	// and once its record names it; "" hits none.
	started, recorded string
	// record names the VM in the sandbox's record; nil records nothing.
	record func(mach vmm.Machine) error
	// paused: the VM starts paused, from saved memory (Driver.Resume), and
	// its guest may run only once its record names it.
	paused bool
	// restored: the guest goes on from saved memory, so it is connected to
	// on new connections until it answers and renewed with renew.
	restored bool
	renew    agentproto.RenewRequest
	// ready runs once the guest answers, before the instance gets the
	// client (the Configure of env and CA bundle); nil does nothing.
	ready func(ctx context.Context, mach vmm.Machine, c *guest.Client) error
}

// booted is how far a bootPlan got.
type booted struct {
	mach     vmm.Machine   // nil if it never started
	client   *guest.Client // nil unless the boot succeeded
	recorded bool          // the record names the VM
}

// bootGuest runs p: start, record, let run, connect (dial and handshake),
// ready. On error the guest connection is closed and the VM left as it is
// for the caller's undo.
func (m *Manager) bootGuest(ctx context.Context, p bootPlan) (booted, error) {
	b := booted{mach: p.mach}
	if p.start != nil {
		mach, err := p.start(ctx)
		if err != nil {
			return b, err
		}
		b.mach = mach
		faultpoint.Hit(p.started)
		p.mark("start")
		if p.in != nil {
			p.in.mu.Lock()
			p.in.machine = mach
			p.in.mu.Unlock()
		}
	}
	if p.record != nil {
		if err := p.record(b.mach); err != nil {
			return b, err
		}
		b.recorded = true
		faultpoint.Hit(p.recorded)
		p.mark("recordVM")
	}
	if p.paused {
		// Recorded: only now may the guest run (a crash before this
		// leaves a VM that never ran, and its state, for the next start
		// to use).
		if err := vmm.Continue(ctx, b.mach); err != nil {
			return b, err
		}
		p.mark("continue")
	}
	var c *guest.Client
	var err error
	switch {
	case p.in == nil:
		c, err = handshake(ctx, b.mach)
	case p.restored:
		c, err = m.link.attachResumed(ctx, p.in, b.mach, p.renew, p.in.steps)
	default:
		c, err = m.link.connect(ctx, p.in, b.mach, p.in.steps)
	}
	if err != nil {
		return b, err
	}
	if p.ready != nil {
		if err := p.ready(ctx, b.mach, c); err != nil {
			c.Close()
			return b, err
		}
		p.mark("configure")
	}
	if p.in != nil {
		p.in.mu.Lock()
		p.in.client = c
		p.in.mu.Unlock()
	}
	b.client = c
	return b, nil
}

// mark ends phase name of p's sandbox's timeline, if it has one.
func (p bootPlan) mark(name string) {
	if p.in != nil {
		p.in.steps.mark(name)
	}
}

// configure is a bootPlan's ready step that sends the guest req.
func configure(req agentproto.ConfigureRequest) func(context.Context, vmm.Machine, *guest.Client) error {
	return func(ctx context.Context, _ vmm.Machine, c *guest.Client) error {
		return c.Configure(ctx, req)
	}
}

// resumeVM is a bootPlan's start for sb's VM from its saved memory, by
// driver; what names the VM in an error.
func resumeVM(driver vmm.Driver, files sandboxFiles, sb *Sandbox, what string) func(context.Context) (vmm.Machine, error) {
	return func(ctx context.Context) (vmm.Machine, error) {
		mach, err := driver.Resume(ctx, files.vmSpec(sb))
		if err != nil {
			return nil, fmt.Errorf("resuming %s: %w", what, err)
		}
		return mach, nil
	}
}

// recordStarting names mach in the record of a starting sandbox. A
// sandbox no longer starting (stopped or deleted meanwhile) refuses it
// with the error refusal.
func (m *Manager) recordStarting(id string, mach vmm.Machine, refusal string) error {
	starting := false
	_, err := m.update(context.Background(), id, func(s *Sandbox) bool {
		if starting = s.State == StateStarting; starting {
			s.VM, s.Accel = mach.Record(), mach.Accel()
		}
		return starting
	})
	if err == nil && !starting {
		err = errors.New(refusal)
	}
	return err
}

// handshake dials the guest of a VM that belongs to no sandbox and
// completes the handshake.
func handshake(ctx context.Context, mach vmm.Machine) (*guest.Client, error) {
	conn, err := mach.DialGuest(ctx)
	if err != nil {
		return nil, err
	}
	c, err := guest.Handshake(ctx, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// boot starts the VM and waits for its agent, retrying once: a TCG guest can
// still hang early in boot, and a fresh VM nearly always comes up.
// With keepDisk it boots from the disk the sandbox already has (restart).
func (m *Manager) boot(ctx context.Context, in *instance, sb *Sandbox, env map[string]string, keepDisk bool) {
	defer close(in.bootDone)
	log := m.log.With("sandbox_id", sb.ID)
	var lastErr error
	for attempt := 1; attempt <= 2; attempt++ {
		start := time.Now()
		err := m.bootOnce(ctx, in, sb, env, keepDisk)
		if err == nil {
			log.Info("sandbox ready", "attempt", attempt, "took", time.Since(start).Round(time.Millisecond))
			m.prepareReady(ctx, in, sb, map[string]any{"attempt": attempt, "bootMs": time.Since(start).Milliseconds()})
			return
		}
		lastErr = err
		log.Warn("boot attempt failed", "attempt", attempt, "err", err)
		m.event(sb.ID, "boot_failed", err.Error(), map[string]any{"attempt": attempt})
		// Keep this attempt's console for whoever investigates.
		_ = os.Rename(filepath.Join(m.files.dir(sb.ID), "console.log"), filepath.Join(m.files.dir(sb.ID), fmt.Sprintf("console-attempt%d.log", attempt)))
		if ctx.Err() != nil {
			return // stopped or deleted while booting; that path records the end
		}
	}
	log.Error("sandbox failed to start", "err", lastErr)
	m.finish(in, ReasonStartFailed)
}

// ready records that a sandbox's agent answers and starts its lease (an
// extension asked for while it booted is kept if it ends later).
func (m *Manager) ready(in *instance, data map[string]any) {
	// The first command sees the egress secrets' placeholders.
	m.Secrets.pushRecord(in.ctx, in)
	now := m.now()
	changed := false
	// The phases end here, before the record is written with its event.
	in.steps.mark("running")
	ready := &TrailEntry{Type: "ready", Message: "sandbox is running", Data: withPhases(data, in.steps)}
	_, err := m.update(context.Background(), in.id, func(s *Sandbox) bool {
		if s.State != StateStarting {
			return false // stopped or deleted while booting
		}
		expires := m.cfg.Limits.leaseEnd(s, now)
		if expires != nil && s.ExpiresAt != nil && s.ExpiresAt.After(*expires) {
			expires = s.ExpiresAt
		}
		if end := m.cfg.Limits.lifetimeEnd(s); expires != nil && !end.IsZero() && expires.After(end) {
			expires = &end
		}
		s.State, s.ReadyAt, s.ExpiresAt = StateRunning, &now, expires
		changed = true
		return true
	}, ready)
	if err != nil {
		m.log.Error("recording ready sandbox", "sandbox_id", in.id, "err", err)
	}
	if !changed {
		return
	}
	in.touch(now)
	m.outcomes.ready(data)
	m.spawn(func() { m.watch(in) })
}

func (m *Manager) bootOnce(ctx context.Context, in *instance, sb *Sandbox, env map[string]string, keepDisk bool) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	defer cancel()
	spec := m.files.vmSpec(sb)
	spec.KeepDisk = keepDisk
	b, err := m.bootGuest(ctx, bootPlan{
		in:      in,
		start:   func(ctx context.Context) (vmm.Machine, error) { return m.cfg.Driver.Start(ctx, spec) },
		started: "create.vm_started", recorded: "create.vm_recorded",
		record: func(mach vmm.Machine) error { return m.recordStarting(sb.ID, mach, "stopped while booting") },
		ready:  configure(agentproto.ConfigureRequest{Env: env, CACerts: m.cfg.ExtraCAs}),
	})
	switch {
	case err == nil:
		m.Secrets.bootedWith(in)
		return nil
	case b.mach == nil:
		return err
	case !b.recorded:
		_ = b.mach.Stop(context.Background())
		return err
	case m.closing.Load():
		// The server is shutting down, not failing this boot: the VM
		// and its record stay for the next process to resume.
		return fmt.Errorf("server shutting down: %w", err)
	}
	_ = b.mach.Stop(context.Background())
	in.mu.Lock()
	in.machine = nil
	in.mu.Unlock()
	if ctx.Err() != nil {
		return fmt.Errorf("agent did not report ready within %s: %w", m.cfg.BootTimeout, err)
	}
	return err
}

// guestLink connects to the guest of a sandbox's VM: the handshake, the
// guest's own streams through the sandbox's gate, its conduct watched.
type guestLink struct {
	conduct conduct
	gates   *gates
}

// connect dials the guest and completes the handshake; the agent answers
// once the guest has booted. It marks its phases on steps (nil: none).
func (l guestLink) connect(ctx context.Context, in *instance, mach vmm.Machine, steps *timeline) (*guest.Client, error) {
	c, err := handshake(ctx, mach)
	if err != nil {
		return nil, err
	}
	steps.mark("handshake")
	c.SetViolationHandler(func(v guest.Violation) { l.conduct.violation(in, v) })
	c.ServeGuestStreams(l.gates.handler(in))
	_, err = c.Info(ctx)
	steps.mark("info")
	if err != nil {
		c.Close()
		if ctx.Err() == nil && errdefs.Code(err) == "guest_unavailable" {
			l.conduct.violation(in, guest.Violation{Method: "session", Problem: "ended before answering info"})
		}
		return nil, err
	}
	return c, nil
}

// attachResumed connects to a guest that goes on from saved memory and
// renews what it must not keep from its past: its randomness and its
// clock, and whatever else renew names (a copy's identity).
func (l guestLink) attachResumed(ctx context.Context, in *instance, mach vmm.Machine, renew agentproto.RenewRequest, steps *timeline) (*guest.Client, error) {
	c, err := l.connectRestored(ctx, in, mach, steps)
	if err != nil {
		return nil, fmt.Errorf("connecting to the resumed guest: %w", err)
	}
	renew.Seed = make([]byte, 32)
	_, _ = rand.Read(renew.Seed)
	renew.UnixNano = time.Now().UnixNano() // the host's real clock, whatever m.now says
	if err := c.Renew(ctx, renew); err != nil {
		if errdefs.Code(err) != agentproto.CodeUnknownMethod {
			c.Close()
			return nil, fmt.Errorf("renewing the resumed guest: %w", err)
		}
		// An agent from before renew: it runs, with its old randomness
		// and a clock that catches up on its own.
		l.conduct.warn(in, "the guest agent cannot renew its randomness and clock (unknown_method)")
	}
	steps.mark("renew")
	return c, nil
}

// restoredTry bounds one connection attempt to a guest restored from saved
// memory. Its agent answers within a few hundred milliseconds when it was
// saved detached; one saved in a session (a crash came before the detach)
// may first have to end that session, and a new connection is what gets
// its attention soonest.
const restoredTry = 2 * time.Second

// connectRestored connects to a restored guest, on a new connection every
// restoredTry, until ctx ends.
func (l guestLink) connectRestored(ctx context.Context, in *instance, mach vmm.Machine, steps *timeline) (*guest.Client, error) {
	for {
		tctx, cancel := context.WithTimeout(ctx, restoredTry)
		c, err := l.connect(tctx, in, mach, steps)
		cancel()
		if err == nil || ctx.Err() != nil || isDone(mach.Done()) {
			return c, err
		}
	}
}

// bootTemplate starts a sandbox as a copy of the template in dir, and
// boots it if that fails: a template is an optimisation, never a reason
// for a create to fail.
//
// templates.pin pinned dir for this create; the pin goes once the
// sandbox's directory names the template (templateUse) or the copy was given up.
func (m *Manager) bootTemplate(ctx context.Context, in *instance, sb *Sandbox, dir string, env map[string]string) {
	start := time.Now()
	spec := m.files.vmSpec(sb)
	use := filepath.Join(spec.Dir, templateUse)
	err := os.MkdirAll(spec.Dir, 0o700)
	if err == nil {
		err = os.WriteFile(use, []byte(dir+"\n"), 0o600)
	}
	m.Templates.unpin(dir)
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
		err = m.cfg.Driver.Clone(cctx, dir, spec)
		cancel()
		in.steps.mark("clone")
	}
	if err == nil {
		if err = m.resumeCopy(ctx, in, sb, env); err == nil {
			m.Secrets.bootedWith(in) // the template was configured as a boot is
			m.prepareReady(ctx, in, sb, map[string]any{"template": true, "resumeMs": time.Since(start).Milliseconds()})
			close(in.bootDone)
			return
		}
	}
	if ctx.Err() != nil || m.closing.Load() {
		close(in.bootDone)
		return // stopped, deleted or shutting down: that path records the end
	}
	m.log.Warn("restoring a template failed; booting instead", "sandbox_id", sb.ID, "err", err)
	m.event(sb.ID, "template_failed", err.Error(), nil)
	_ = os.Remove(use) // the boot makes a disk of its own, over the image's
	m.boot(ctx, in, sb, env, false)
}
