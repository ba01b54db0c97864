package sandbox

import (
	"context"
	"time"
)

// leaseTick is how often the lease clock looks for expired leases; a lease
// ends at most this late.
const leaseTick = time.Second

// Run enforces leases until ctx ends: a sandbox whose lease has ended is
// stopped or deleted as its onLeaseEnd says, with stopReason lease_expired.
func (m *Manager) Run(ctx context.Context) error {
	t := time.NewTicker(leaseTick)
	defer t.Stop()
	for {
		m.ExpireLeases(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// ExpireLeases ends every live sandbox whose lease is over at m's clock,
// and pauses every one idle for its idlePauseSeconds, and returns their
// ids.
func (m *Manager) ExpireLeases(ctx context.Context) []string {
	live, err := m.cfg.Store.ListLive(ctx)
	if err != nil {
		m.log.Error("listing live sandboxes", "err", err)
		return nil
	}
	now := m.now()
	var ended []string
	if id := m.relievePressure(ctx, live); id != "" {
		ended = append(ended, id)
	}
	for _, sb := range live {
		if sb.State != StateRunning {
			continue
		}
		if sb.ExpiresAt == nil || sb.ExpiresAt.After(now) {
			if m.idle(sb, now) {
				m.log.Info("idle; pausing", "sandbox_id", sb.ID, "idle_pause_seconds", sb.IdlePauseSeconds)
				ended = append(ended, sb.ID)
				if _, err := m.pause(ctx, sb.ID, PauseIdle); err != nil {
					m.log.Error("pausing an idle sandbox", "sandbox_id", sb.ID, "err", err)
				}
			}
			continue
		}
		m.log.Info("lease expired", "sandbox_id", sb.ID, "on_lease_end", sb.OnLeaseEnd)
		m.cfg.Observer.LeaseExpired(sb.OnLeaseEnd)
		ended = append(ended, sb.ID)
		if sb.OnLeaseEnd == LeaseEndDelete {
			m.spawn(func() {
				if _, err := m.delete(m.ctx, sb.ID, ReasonLeaseExpired); err != nil {
					m.log.Error("deleting at lease end", "sandbox_id", sb.ID, "err", err)
				}
			})
			continue
		}
		if sb.OnLeaseEnd == LeaseEndPause {
			if _, err := m.pause(ctx, sb.ID, PauseLeaseEnd); err != nil {
				m.log.Error("pausing at lease end", "sandbox_id", sb.ID, "err", err)
			}
			continue
		}
		if _, err := m.stop(ctx, sb.ID, ReasonLeaseExpired, false); err != nil {
			m.log.Error("stopping at lease end", "sandbox_id", sb.ID, "err", err)
		}
	}
	return ended
}

// idle reports whether a running sandbox has had no API activity for its
// idlePauseSeconds: no call into its guest in flight, and none ended
// within that time. A persistent sandbox is never idle; activity is kept
// in memory, so after a restart of the server the clock starts again.
func (m *Manager) idle(sb *Sandbox, now time.Time) bool {
	if sb.Persistent || sb.IdlePauseSeconds <= 0 {
		return false
	}
	m.mu.Lock()
	in := m.live[sb.ID]
	m.mu.Unlock()
	if in == nil {
		return false
	}
	if in.working() {
		return false
	}
	last := in.active.Load()
	if last == 0 {
		in.touch(now) // reattached: counted from now
		return false
	}
	return now.Sub(time.Unix(0, last)) >= time.Duration(sb.IdlePauseSeconds)*time.Second
}
