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

// ExpireLeases ends every live sandbox whose lease is over at m's clock and
// returns their ids.
func (m *Manager) ExpireLeases(ctx context.Context) []string {
	live, err := m.cfg.Store.ListLive(ctx)
	if err != nil {
		m.log.Error("listing live sandboxes", "err", err)
		return nil
	}
	now := m.now()
	var ended []string
	for _, sb := range live {
		if sb.State != StateRunning || sb.ExpiresAt == nil || sb.ExpiresAt.After(now) {
			continue
		}
		m.log.Info("lease expired", "sandbox_id", sb.ID, "on_lease_end", sb.OnLeaseEnd)
		ended = append(ended, sb.ID)
		if sb.OnLeaseEnd == LeaseEndDelete {
			m.spawn(func() {
				if _, err := m.delete(m.ctx, sb.ID, ReasonLeaseExpired); err != nil {
					m.log.Error("deleting at lease end", "sandbox_id", sb.ID, "err", err)
				}
			})
			continue
		}
		if _, err := m.stop(ctx, sb.ID, ReasonLeaseExpired, false); err != nil {
			m.log.Error("stopping at lease end", "sandbox_id", sb.ID, "err", err)
		}
	}
	return ended
}
