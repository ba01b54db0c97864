package sandbox

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/emberbox/emberbox/internal/vmm"
)

// EndVMs ends any VM still running of the sandboxes listed, without a
// write to the store: in a cluster, a node that comes back ends the VMs of
// the sandboxes the other nodes declared lost (stopped, reason node_lost)
// while it was away, so that none runs unaccounted for. It returns how
// many it ended.
func (mv *Moves) EndVMs(ctx context.Context, list []*Sandbox) int {
	k, ok := mv.driver.(vmm.StrayKiller)
	if !ok {
		return 0
	}
	ended := 0
	for _, sb := range list {
		n, err := k.KillStray(ctx, mv.files.vmSpec(sb))
		if err != nil {
			mv.log.Warn("ending the vm of a sandbox declared lost", "sandbox_id", sb.ID, "err", err)
			continue
		}
		if n > 0 {
			mv.log.Info("ended the vm of a sandbox the cluster declared lost", "sandbox_id", sb.ID)
		}
		ended += n
	}
	return ended
}

// StandDown ends every VM this manager runs, without a write to the store,
// and closes the manager: in a cluster, a node fenced by the others (they
// declared it lost and stopped its sandboxes) must not go on running them.
func (mv *Moves) StandDown(ctx context.Context) {
	for _, in := range mv.host.instances() {
		mach := in.vm()
		if mach == nil {
			continue
		}
		if err := mach.Stop(ctx); err != nil {
			mv.log.Warn("standing down: ending a vm", "sandbox_id", in.id, "err", err)
		}
	}
	mv.host.Close()
}

// RemoveMovedAway removes the directories of sandboxes that another node
// now holds, asking movedAway which of the sandbox directories here those
// are. A drain's sender removes a sandbox's files once the receiver has
// committed the move; a sender that died between the two keeps them, and
// removes them at its next start with this, before Recover; and so for
// checkpoints that moved and snapshots fetched (Snapshots.removeElsewhere). It returns how many
// sandboxes' directories it removed.
func (mv *Moves) RemoveMovedAway(ctx context.Context, movedAway func(ctx context.Context, ids []string) ([]string, error)) (int, error) {
	if n := mv.snaps.removeAllElsewhere(ctx); n > 0 {
		mv.log.Info("removed the files of snapshots and checkpoints another node holds", "snapshots", n)
	}
	entries, err := os.ReadDir(mv.files.root())
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("listing sandbox directories: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "sbx_") {
			ids = append(ids, e.Name())
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	away, err := movedAway(ctx, ids)
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, id := range away {
		if err := removeAll(mv.files.dir(id)); err != nil {
			mv.log.Warn("removing the files of a sandbox moved to another node", "sandbox_id", id, "err", err)
			continue
		}
		mv.log.Info("removed the files of a sandbox another node holds", "sandbox_id", id)
		removed++
	}
	return removed, nil
}
