package sandbox

import (
	"context"

	"github.com/emberbox/emberbox/internal/vmm"
)

// EndVMs ends any VM still running of the sandboxes listed, without a
// write to the store: in a cluster, a node that comes back ends the VMs of
// the sandboxes the other nodes declared lost (stopped, reason node_lost)
// while it was away, so that none runs unaccounted for. It returns how
// many it ended.
func (m *Manager) EndVMs(ctx context.Context, list []*Sandbox) int {
	k, ok := m.cfg.Driver.(vmm.StrayKiller)
	if !ok {
		return 0
	}
	ended := 0
	for _, sb := range list {
		n, err := k.KillStray(ctx, m.vmSpec(sb))
		if err != nil {
			m.log.Warn("ending the vm of a sandbox declared lost", "sandbox_id", sb.ID, "err", err)
			continue
		}
		if n > 0 {
			m.log.Info("ended the vm of a sandbox the cluster declared lost", "sandbox_id", sb.ID)
		}
		ended += n
	}
	return ended
}

// StandDown ends every VM this manager runs, without a write to the store,
// and closes the manager: in a cluster, a node fenced by the others (they
// declared it lost and stopped its sandboxes) must not go on running them.
func (m *Manager) StandDown(ctx context.Context) {
	for _, in := range m.instances() {
		mach := in.vm()
		if mach == nil {
			continue
		}
		if err := mach.Stop(ctx); err != nil {
			m.log.Warn("standing down: ending a vm", "sandbox_id", in.id, "err", err)
		}
	}
	m.Close()
}
