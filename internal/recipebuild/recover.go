package recipebuild

import (
	"context"
	"fmt"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Recover clears what builds cut short by a restart left: their sandboxes
// (the catalog fails those builds) and the snapshots no cache entry names
// (captured but not yet recorded, or a build's own with the cache off).
// Call it once at start, before any build runs.
func (b *Builder) Recover(ctx context.Context) error {
	stray, err := b.clearStraySandboxes(ctx)
	if err != nil {
		return err
	}
	orphans, err := b.clearOrphanSnapshots(ctx)
	if err != nil {
		return err
	}
	if stray+orphans > 0 {
		b.log.Info("cleared what interrupted image builds left", "sandboxes", stray, "snapshots", orphans)
	}
	return nil
}

// clearStraySandboxes deletes the build owner's sandboxes that are not
// deleted or being deleted, and says how many there were.
func (b *Builder) clearStraySandboxes(ctx context.Context) (int, error) {
	m := b.cfg.Manager
	var stray []string
	for cursor := ""; ; {
		sbs, next, err := m.List(ctx, sandbox.ListOptions{OwnerKeyID: Owner, IncludeStopped: true, Limit: 100, Cursor: cursor})
		if err != nil {
			return 0, fmt.Errorf("listing build sandboxes: %w", err)
		}
		for _, sb := range sbs {
			if sb.State != sandbox.StateDeleted && sb.State != sandbox.StateDeleting {
				stray = append(stray, sb.ID)
			}
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	for _, id := range stray {
		if _, err := m.Delete(ctx, Owner, id); err != nil && !errdefs.IsNotFound(err) {
			return 0, fmt.Errorf("deleting build sandbox %s: %w", id, err)
		}
	}
	return len(stray), nil
}

// clearOrphanSnapshots deletes the build owner's snapshots no cache entry
// names, and says how many there were.
func (b *Builder) clearOrphanSnapshots(ctx context.Context) (int, error) {
	kept := map[string]bool{}
	if b.cfg.Cache != nil {
		all, err := b.cfg.Cache.BuildCacheSnapshots(ctx)
		if err != nil {
			return 0, err
		}
		for _, id := range all {
			kept[id] = true
		}
	}
	var orphans []string
	for cursor := ""; ; {
		sns, next, err := b.cfg.Snapshots.ListSnapshots(ctx, sandbox.SnapshotListOptions{OwnerKeyID: Owner, Limit: 100, Cursor: cursor})
		if err != nil {
			return 0, fmt.Errorf("listing build snapshots: %w", err)
		}
		for _, sn := range sns {
			if !kept[sn.ID] {
				orphans = append(orphans, sn.ID)
			}
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	for _, id := range orphans {
		if err := b.cfg.Snapshots.DeleteSnapshot(ctx, Owner, id); err != nil && !errdefs.IsNotFound(err) {
			return 0, fmt.Errorf("deleting build snapshot %s: %w", id, err)
		}
	}
	return len(orphans), nil
}
