package sandbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/faultpoint"
	"github.com/emberbox/emberbox/internal/vmm"
)

// pauseTimeout bounds one vmm.Pause: memory goes to disk at disk speed.
const pauseTimeout = 2 * time.Minute

// Pause reasons, in the paused event.
const (
	PauseRequested = "requested"
	PauseLeaseEnd  = "lease_expired"
	PauseIdle      = "idle"
	// PauseMove: a drain moves the running sandbox to another node, where
	// it is woken at once with its lease as it was (move.go).
	PauseMove = "move"
	// PauseMemoryPressure: the host ran low on memory and this was the
	// sandbox idle longest (pressure.go).
	PauseMemoryPressure = "memory_pressure"
	// PauseDiskPressure: the data dir's filesystem ran low on space and
	// this sandbox's files were growing (diskpressure.go).
	PauseDiskPressure = "disk_pressure"
)

// opLock serializes the steps that change a sandbox's VM (pause, wake,
// restart, snapshot, and the end of a stop or delete), so that one never
// acts on a VM another is replacing. The record's state is still changed
// only by update; the lock is about the VM.
type opLock struct {
	mu   sync.Mutex
	refs int
}

// lockOp takes the VM lock of sandbox id and returns its unlock.
func (m *Manager) lockOp(id string) (unlock func()) {
	m.mu.Lock()
	l := m.ops[id]
	if l == nil {
		l = &opLock{}
		m.ops[id] = l
	}
	l.refs++
	m.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		m.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(m.ops, id)
		}
		m.mu.Unlock()
	}
}

func notPaused(sb *Sandbox) error {
	e := errdefs.New(errdefs.ErrConflict, "not_paused", "sandbox %s is %s, not paused", sb.ID, sb.State.Wire()).
		WithHint("only a paused sandbox can be woken")
	e.Details = map[string]any{"state": string(sb.State.Wire())}
	return e
}

// Pause implements api.Manager.Pause: a running sandbox is recorded
// pausing and paused in the background; a pausing or paused one is
// answered as it is (pausing twice is one pause).
func (m *Manager) Pause(ctx context.Context, owner, id string) (_ *Sandbox, err error) {
	defer func() { m.outcomes.op("pause", err) }()
	sb, err := m.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sb.State == StateResuming {
		// A wake under way finishes first; then this pauses it again.
		wctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout+5*time.Second)
		sb, err = m.WaitFor(wctx, owner, id, StateRunning, StatePaused)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	switch sb.State {
	case StatePausing, StatePaused:
		return sb, nil
	case StateRunning:
		return m.pause(ctx, id, PauseRequested)
	}
	return nil, Refusal(sb)
}

// pause records a running sandbox pausing and pauses its VM in an owned
// goroutine. A crash after the record is finished by Recover.
func (m *Manager) pause(ctx context.Context, id, why string) (*Sandbox, error) {
	now := m.now()
	changed := false
	sb, err := m.update(ctx, id, func(s *Sandbox) bool {
		// An idle pause looks again in the transaction: a call that
		// began since the sandbox was found idle keeps it running.
		if changed = s.State == StateRunning && (why != PauseIdle || m.Reaper.idle(s, now)); changed {
			s.State, s.PausedAt = StatePausing, &now
		}
		return changed
	})
	if err != nil || !changed {
		return sb, err
	}
	faultpoint.Hit("pause.recorded")
	// Shutting down: the record says pausing and the next start
	// finishes the pause.
	m.spawn(func() { m.finishPause(id, why) })
	return sb, nil
}

// finishPause pauses the VM of a sandbox recorded pausing and records it
// paused. A pause that fails with the VM still running leaves it running.
func (m *Manager) finishPause(id, why string) {
	unlock := m.lockOp(id)
	defer unlock()
	m.pauseLocked(id, why, true)
}

// pauseLocked is finishPause under the sandbox's VM lock. It reports
// whether the VM's state is saved and its instance gone; with record it
// also records the sandbox paused (a switch of image keeps it pausing).
func (m *Manager) pauseLocked(id, why string, record bool) bool {
	log := m.log.With("sandbox_id", id)
	sb, err := m.cfg.Store.GetSandbox(m.ctx, id)
	if err != nil || sb.State != StatePausing {
		return false // stopped or deleted meanwhile: that path ends the VM
	}
	m.mu.Lock()
	in := m.live[id]
	m.mu.Unlock()
	var mach vmm.Machine
	if in != nil {
		if c := in.guest(); c != nil {
			c.Ending(pausedUnder(id, why))
		}
		in.cancel() // the watcher lets go; the guest connection goes with the VMM
		<-in.bootDone
		m.Meter.guestClosing(in)
		m.link.detach(context.Background(), in)
		in.mu.Lock()
		mach = in.machine
		in.mu.Unlock()
	}
	start := time.Now()
	if mach != nil {
		ctx, cancel := context.WithTimeout(context.Background(), pauseTimeout)
		err = vmm.Pause(ctx, mach)
		cancel()
	} else {
		err = errors.New("no vm to pause")
	}
	if err != nil {
		log.Warn("pause failed", "err", err)
		m.event(id, "pause_failed", "pause failed", nil)
		if mach != nil && !isDone(mach.Done()) {
			m.carryOn(in, mach)
			return false
		}
	}
	faultpoint.Hit("pause.saved")
	if in != nil {
		m.Meter.vmEnded(in, mach)
		m.forget(in)
	}
	if err != nil && !m.cfg.Driver.Saved(m.files.vmSpec(sb)) {
		m.markStopped(id, ReasonPauseFailed)
		return false
	}
	if !record {
		return true
	}
	took := time.Since(start)
	if m.recordPaused(id, &TrailEntry{Type: "paused", Message: "sandbox paused",
		Data: map[string]any{"reason": why, "pauseMs": took.Milliseconds()}}) {
		log.Info("sandbox paused", "why", why, "took", took.Round(time.Millisecond))
	}
	return true
}

// pausedUnder is the error of a call into the guest that was in flight
// when its sandbox paused: its command goes on after a wake, the call that
// watched it does not.
func pausedUnder(id, why string) error {
	e := errdefs.New(errdefs.ErrConflict, CodeSandboxPaused, "sandbox %s was paused (%s) while this call was in flight", id, why).
		WithHint("its processes go on after a wake: read a process's output by its id, or attach to it again")
	e.Details = map[string]any{"reason": why}
	return e
}

// recordPaused records a pausing or resuming sandbox paused, with no VM;
// update's account lets go of all but its disk in the admission ledger.
func (m *Manager) recordPaused(id string, entries ...*TrailEntry) bool {
	changed := false
	// A sandbox paused to move keeps its lease: it runs on at once where
	// it goes (move.go).
	keepLease := m.Moves.moving(id)
	_, err := m.update(context.Background(), id, func(s *Sandbox) bool {
		if changed = s.State == StatePausing || s.State == StateResuming; changed {
			s.State, s.VM = StatePaused, nil
			if !keepLease {
				s.ExpiresAt = nil
			}
			if s.PausedAt == nil {
				now := m.now()
				s.PausedAt = &now
			}
		}
		return changed
	}, entries...)
	if err != nil {
		m.log.Error("recording paused sandbox", "sandbox_id", id, "err", err)
		return false
	}
	return changed // update shrank the claim to the disk (account)
}

// carryOn puts a VM whose pause failed, and still runs, back to work: a
// new instance, its egress gate, the record running again.
func (m *Manager) carryOn(old *instance, mach vmm.Machine) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := vmm.Continue(ctx, mach); err != nil {
		m.log.Warn("letting the vm run after a failed pause", "sandbox_id", old.id, "err", err)
	}
	m.gates.close(old)
	in := newInstance(m.ctx, old.id)
	close(in.bootDone)
	in.machine = mach
	in.gate = m.gates.restore(ctx, old.id)
	in.touch(m.now())
	m.mu.Lock()
	m.live[old.id] = in
	m.mu.Unlock()
	changed := false
	if _, err := m.update(context.Background(), old.id, func(s *Sandbox) bool {
		if changed = s.State == StatePausing; changed {
			s.State, s.PausedAt = StateRunning, nil
		}
		return changed
	}); err != nil {
		m.log.Error("recording a sandbox running after a failed pause", "sandbox_id", old.id, "err", err)
	}
	// Unchanged: a stop or delete came meanwhile, and its endVM, waiting
	// for the VM lock, stops this instance's VM.
	m.spawn(func() { m.watch(in) })
}

// forget drops a sandbox's instance: its guest connection and gate.
func (m *Manager) forget(in *instance) {
	in.cancel()
	if c := in.guest(); c != nil {
		c.Close()
	}
	m.gates.close(in)
	m.mu.Lock()
	if m.live[in.id] == in {
		delete(m.live, in.id)
	}
	m.mu.Unlock()
}

// Wake implements api.Manager.Wake: a paused sandbox is admitted again,
// recorded resuming and resumed in the background; timeout, if not nil,
// is its new time limit in seconds (0: none). A pausing one is woken once
// its pause is over; a resuming one is answered as it is; a running one
// gets not_paused.
func (m *Manager) Wake(ctx context.Context, owner, id string, timeout *int) (_ *Sandbox, err error) {
	defer func() { m.outcomes.op("wake", err) }()
	sb, err := m.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sb.State == StatePausing {
		wctx, cancel := context.WithTimeout(ctx, pauseTimeout)
		sb, err = m.WaitFor(wctx, owner, id, StatePaused, StateRunning)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	switch sb.State {
	case StateResuming:
		return sb, nil
	case StatePaused:
		return m.wake(ctx, id, timeout)
	case StateRunning, StateStarting:
		return nil, notPaused(sb)
	}
	return nil, Refusal(sb)
}

// wake admits a paused sandbox again and records it resuming, or refuses
// it (no_capacity, quota_exceeded) leaving it paused, then resumes its VM
// in an owned goroutine.
func (m *Manager) wake(ctx context.Context, id string, timeout *int) (*Sandbox, error) {
	unlock := m.lockOp(id)
	handed := false
	defer func() {
		if !handed {
			unlock()
		}
	}()
	sb, err := m.cfg.Store.GetSandbox(ctx, id)
	if err != nil || sb.State != StatePaused {
		return sb, err
	}
	if !m.cfg.Admission.Held(id) {
		// Every sandbox paused here holds its disk in the ledger; one that
		// does not is another node's (moved there, move.go), and a resume
		// here would find no state and record it stopped.
		return nil, errNotOnNode(id)
	}
	m.Meter.accrueKept(ctx, sb, m.now())
	whole := *sb
	whole.State = StateResuming
	if err := m.cfg.Admission.Replace(claim(&whole)); err != nil {
		return nil, err
	}
	changed := false
	sb, err = m.update(ctx, id, func(s *Sandbox) bool {
		if changed = s.State == StatePaused; changed {
			s.State = StateResuming
			if timeout != nil {
				s.TimeoutSeconds = *timeout
			}
		}
		return changed
	})
	if err != nil || !changed {
		m.cfg.Admission.Restore(claim(&Sandbox{ID: id, OwnerKeyID: whole.OwnerKeyID, Labels: whole.Labels, DiskMiB: whole.DiskMiB, State: StatePaused}))
		return sb, err
	}
	faultpoint.Hit("wake.recorded")
	handed = m.spawn(func() {
		defer unlock()
		m.finishWake(sb)
	})
	return sb, nil
}

// finishWake resumes the VM of a sandbox recorded resuming, renews its
// guest and records it running with a new lease. A wake that fails leaves
// the sandbox paused if its saved state is still there, else stopped.
func (m *Manager) finishWake(sb *Sandbox) {
	start := time.Now()
	in := newInstance(m.ctx, sb.ID)
	in.steps = newTimeline()
	defer close(in.bootDone)
	in.gate = m.gates.restore(m.ctx, sb.ID)
	m.mu.Lock()
	m.live[sb.ID] = in
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(in.ctx, m.cfg.BootTimeout)
	defer cancel()
	b, err := m.bootGuest(ctx, bootPlan{
		in:      in,
		start:   resumeVM(m.cfg.Driver, m.files, sb, "the vm"),
		started: "wake.resumed",
		record: func(mach vmm.Machine) error {
			_, err := m.update(context.Background(), sb.ID, func(s *Sandbox) bool {
				if s.State != StateResuming {
					return false
				}
				s.VM, s.Accel = mach.Record(), mach.Accel()
				return true
			})
			return err
		},
		paused: true, restored: true,
	})
	if err != nil {
		m.wakeFailed(in, sb, b.mach, err)
		return
	}
	m.log.Info("sandbox woken", "sandbox_id", sb.ID, "took", time.Since(start).Round(time.Millisecond))
	m.running(in, "woken", map[string]any{"wakeMs": time.Since(start).Milliseconds()})
}

// running records a resuming sandbox running with a new lease and starts
// watching it. Unchanged (a stop or delete came meanwhile), the VM is left
// to that stop's endVM.
func (m *Manager) running(in *instance, event string, data map[string]any) {
	// Secrets may have changed while it was paused or copied.
	m.Secrets.pushRecord(in.ctx, in)
	now := m.now()
	changed := false
	// A sandbox moved while it ran keeps the lease it had.
	keepLease := m.Moves.moving(in.id)
	in.steps.mark("running")
	entry := &TrailEntry{Type: event, Message: "sandbox is running", Data: withPhases(data, in.steps)}
	_, err := m.update(context.Background(), in.id, func(s *Sandbox) bool {
		if changed = s.State == StateResuming; changed {
			s.State, s.PausedAt = StateRunning, nil
			if !keepLease || s.ExpiresAt == nil {
				s.ExpiresAt = m.cfg.Limits.leaseEnd(s, now)
			}
			if s.ReadyAt == nil {
				s.ReadyAt = &now
			}
		}
		return changed
	}, entry)
	if err != nil {
		m.log.Error("recording resumed sandbox", "sandbox_id", in.id, "err", err)
	}
	if !changed {
		return
	}
	in.touch(now)
	m.outcomes.ready(data)
	m.spawn(func() { m.watch(in) })
}

// wakeFailed undoes a wake: a VM that runs is paused again if it can be,
// else stopped; the sandbox is paused if its saved state is there, else
// stopped with reason wake_failed.
func (m *Manager) wakeFailed(in *instance, sb *Sandbox, mach vmm.Machine, cause error) {
	log := m.log.With("sandbox_id", sb.ID)
	log.Warn("wake failed", "err", cause)
	m.event(sb.ID, "wake_failed", "wake failed", nil)
	if mach != nil {
		ctx, cancel := context.WithTimeout(context.Background(), pauseTimeout)
		if err := vmm.Pause(ctx, mach); err != nil {
			log.Warn("pausing again after a failed wake", "err", err)
			_ = mach.Stop(ctx)
		}
		cancel()
	}
	m.forget(in)
	if m.closing.Load() {
		return // shutting down: the record says resuming and Recover decides
	}
	if m.cfg.Driver.Saved(m.files.vmSpec(sb)) {
		m.recordPaused(sb.ID)
		return
	}
	m.markStopped(sb.ID, ReasonWakeFailed)
}

// leaseEnd is when a lease that starts at now ends: nil for a persistent
// sandbox or one without a time limit; never past the maximum lifetime.
func (l Limits) leaseEnd(s *Sandbox, now time.Time) *time.Time {
	if s.Persistent || s.TimeoutSeconds <= 0 {
		return nil
	}
	end := now.Add(time.Duration(s.TimeoutSeconds) * time.Second)
	if life := l.lifetimeEnd(s); !life.IsZero() && end.After(life) {
		end = life
	}
	return &end
}

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// touch records API activity on the sandbox at now, for idle pause.
func (in *instance) touch(now time.Time) { in.active.Store(now.UnixNano()) }

// hold counts the call that ctx carries as work on the sandbox for as long
// as ctx lasts: the sandbox is not idle while it runs, and its idle clock
// starts when the call ends. A context that never ends (no Done channel)
// would hold the sandbox awake forever, so it only counts as activity now.
func (in *instance) hold(ctx context.Context, now func() time.Time) {
	in.touch(now())
	if ctx.Done() == nil {
		return
	}
	in.busy.Add(1)
	context.AfterFunc(ctx, func() {
		// The touch comes first: idle never sees the call gone without
		// the moment it ended.
		in.touch(now())
		in.busy.Add(-1)
	})
}

// working reports whether a call into the sandbox's guest is in flight.
func (in *instance) working() bool { return in.busy.Load() > 0 }
