package sandbox

import (
	"context"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Extend implements api.Manager.Extend.
func (m *Manager) Extend(ctx context.Context, owner, id string, d time.Duration) (*Sandbox, error) {
	sb, err := m.get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sb.State != StateRunning && sb.State != StateStarting {
		return nil, Refusal(sb)
	}
	if sb.Persistent || sb.TimeoutSeconds == 0 {
		return sb, nil // no time limit: nothing to extend
	}
	if d <= 0 || d > MaxExtendAhead {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "seconds must be between 1 and %d", int(MaxExtendAhead.Seconds()))
	}
	exp := m.now().Add(d)
	end := m.cfg.Limits.lifetimeEnd(sb)
	if !end.IsZero() && exp.After(end) {
		if sb.ExpiresAt != nil && !sb.ExpiresAt.Before(end) {
			e := errdefs.New(errdefs.ErrConflict, "lifetime_exceeded",
				"the sandbox's lease already ends at its maximum lifetime of %s", m.cfg.Limits.MaxLifetime).
				WithHint("Create a new sandbox to keep working after this one ends.")
			e.Details = map[string]any{"maxLifetimeSeconds": int64(m.cfg.Limits.MaxLifetime / time.Second)}
			return nil, e
		}
		exp = end // as far as the lifetime allows
	}
	return m.update(ctx, id, func(s *Sandbox) bool {
		if s.State.Terminal() || s.State == StateStopping {
			return false
		}
		if s.ExpiresAt != nil && !s.ExpiresAt.Before(exp) {
			return false // never shortens
		}
		s.ExpiresAt = &exp
		return true
	})
}

// lifetimeEnd is the latest a lease of sb may end, or the zero time.
func (l Limits) lifetimeEnd(sb *Sandbox) time.Time {
	if l.MaxLifetime <= 0 {
		return time.Time{}
	}
	return sb.CreatedAt.Add(l.MaxLifetime)
}
