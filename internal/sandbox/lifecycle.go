package sandbox

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// UpdateSpec is a validated update of a sandbox's settings; nil fields
// stay as they are.
type UpdateSpec struct {
	Name   *string
	Labels map[string]string // replaces the labels when not nil
	// Env sets variables; a nil value removes one. Commands started
	// afterwards see the change.
	Env              map[string]*string
	AutoWake         *bool
	IdlePauseSeconds *int
	Persistent       *bool
	// TimeoutSeconds is a new time limit counted from now (from the next
	// wake for a paused sandbox); 0 takes it away.
	TimeoutSeconds *int
	OnLeaseEnd     *string
}

// envMemory keeps the values of sandboxes' environments in memory (never
// in the store), so that an update of one variable can send the guest the
// whole set and a restart can send it again.
type envMemory struct {
	mu   sync.Mutex
	envs map[string]map[string]string // per sandbox
}

// remember keeps env as sandbox id's; nil forgets it.
func (em *envMemory) remember(id string, env map[string]string) {
	em.mu.Lock()
	defer em.mu.Unlock()
	if env == nil {
		delete(em.envs, id)
		return
	}
	em.envs[id] = maps.Clone(env)
}

// known returns a copy of sandbox id's env, if this process knows it.
func (em *envMemory) known(id string) (map[string]string, bool) {
	em.mu.Lock()
	defer em.mu.Unlock()
	env, ok := em.envs[id]
	return maps.Clone(env), ok
}

func envUnavailable(msg string) error {
	return errdefs.New(errdefs.ErrConflict, "env_unavailable", "%s", msg).
		WithHint("create a new sandbox with the environment it needs")
}

// Update implements api.Manager.Update.
func (m *Manager) Update(ctx context.Context, owner, id string, u UpdateSpec) (*Sandbox, error) {
	sb, err := m.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sb.State == StateDeleting {
		return nil, Refusal(sb)
	}
	var envNames []string
	if len(u.Env) > 0 {
		if envNames, err = m.updateEnv(ctx, owner, sb, u.Env); err != nil {
			return nil, err
		}
	}
	now := m.now()
	sb, err = m.update(ctx, id, func(s *Sandbox) bool {
		if s.State == StateDeleting || s.State == StateDeleted {
			return false
		}
		u.apply(s, envNames, m.cfg.Limits, now)
		return true
	})
	if err != nil {
		return nil, err
	}
	if in := m.liveInstance(id); in != nil && u.IdlePauseSeconds != nil {
		in.touch(now) // counted from now
	}
	return sb, nil
}

// apply writes the settings u changes into s (envNames, if not nil, as its
// variable names); a new lease or timeout starts at now for a sandbox
// that runs.
func (u UpdateSpec) apply(s *Sandbox, envNames []string, lim Limits, now time.Time) {
	if u.Name != nil {
		s.Name = *u.Name
	}
	if u.Labels != nil {
		s.Labels = u.Labels
	}
	if envNames != nil {
		s.EnvNames = envNames
	}
	if u.AutoWake != nil {
		s.AutoWake = *u.AutoWake
	}
	if u.IdlePauseSeconds != nil {
		s.IdlePauseSeconds = *u.IdlePauseSeconds
	}
	if u.Persistent != nil {
		s.Persistent = *u.Persistent
	}
	if u.OnLeaseEnd != nil {
		s.OnLeaseEnd = *u.OnLeaseEnd
	}
	if u.TimeoutSeconds != nil {
		s.TimeoutSeconds = *u.TimeoutSeconds
	}
	if (u.TimeoutSeconds != nil || u.Persistent != nil) && (s.State == StateRunning || s.State == StateStarting) {
		s.ExpiresAt = lim.leaseEnd(s, now)
	}
}

// updateEnv sends the guest its whole environment with the change and
// returns the new variable names. The guest must run (a paused one with
// autoWake is woken), and this server must know the values: they are kept
// in memory only, so not after a restart of the server.
func (m *Manager) updateEnv(ctx context.Context, owner string, sb *Sandbox, change map[string]*string) ([]string, error) {
	env, ok := m.envs.known(sb.ID)
	if !ok && len(sb.EnvNames) > 0 {
		return nil, envUnavailable("this server no longer knows the values of the sandbox's environment (it restarted), so it cannot change one without losing the others")
	}
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range change {
		if v == nil {
			delete(env, k)
		} else {
			env[k] = *v
		}
	}
	_, g, err := m.Guest(ctx, owner, sb.ID)
	if err != nil {
		return nil, err
	}
	c, ok := clientOf(g)
	if !ok {
		return nil, envUnavailable("the sandbox's guest cannot be configured")
	}
	if err := c.Configure(ctx, agentproto.ConfigureRequest{Env: env}); err != nil {
		return nil, err
	}
	m.envs.remember(sb.ID, env)
	return slices.Sorted(maps.Keys(env)), nil
}

// Restart implements api.Manager.Restart: a stopped sandbox whose disk is
// kept boots again from it (its memory is not kept). A running or starting
// one is answered as it is; a paused one is woken.
func (m *Manager) Restart(ctx context.Context, owner, id string) (_ *Sandbox, err error) {
	defer func() { m.outcomes.op("restart", err) }()
	sb, err := m.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	switch sb.State {
	case StateRunning, StateStarting, StateResuming:
		return sb, nil
	case StatePaused, StatePausing:
		return m.Wake(ctx, owner, id, nil)
	case StateStopped:
	default:
		return nil, Refusal(sb)
	}
	unlock := m.lockOp(id)
	defer unlock()
	if sb, err = m.cfg.Store.GetSandbox(ctx, id); err != nil {
		return nil, err
	}
	if sb.State != StateStopped {
		return sb, nil // restarted or deleted meanwhile
	}
	if sb.DiskRemovedAt != nil {
		e := errdefs.New(errdefs.ErrConflict, "disk_removed", "sandbox %s's disk was removed %s after it stopped",
			id, m.Reaper.retention()).WithHint("create a new sandbox; a stopped one keeps its disk only for the retention")
		e.Details = map[string]any{"diskRemovedAt": sb.DiskRemovedAt.Format(time.RFC3339)}
		return nil, e
	}
	m.Meter.accrueKept(ctx, sb, m.now())
	starting := *sb
	starting.State = StateStarting
	if err := m.cfg.Admission.Reserve(claim(&starting)); err != nil {
		return nil, err
	}
	var u undo
	defer u.run()
	u.add(func() { m.cfg.Admission.Release(id) })
	env, known := m.envs.known(id)
	changed := false
	sb, err = m.update(ctx, id, func(s *Sandbox) bool {
		if changed = s.State == StateStopped && s.DiskRemovedAt == nil; changed {
			s.State, s.StopReason, s.VM = StateStarting, "", nil
			s.ReadyAt, s.ExpiresAt, s.EndedAt, s.PausedAt = nil, nil, nil, nil
			if !known {
				s.EnvNames = nil // the values were never stored
			}
		}
		return changed
	})
	if err != nil || !changed {
		return sb, err
	}
	u.keep() // the record holds the claim now (account)
	in := newInstance(m.ctx, id)
	in.gate = m.gates.restore(ctx, id)
	m.mu.Lock()
	m.live[id] = in
	m.mu.Unlock()
	m.event(id, "restarted", "sandbox restarting from its kept disk", map[string]any{"envRestored": known})
	if !m.spawn(func() { m.boot(in.ctx, in, sb, env, true) }) {
		close(in.bootDone)
	}
	return sb, nil
}
