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
	m := b.cfg.Manager
	var stray []string
	for cursor := ""; ; {
		sbs, next, err := m.List(ctx, sandbox.ListOptions{OwnerKeyID: Owner, IncludeStopped: true, Limit: 100, Cursor: cursor})
		if err != nil {
			return fmt.Errorf("listing build sandboxes: %w", err)
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
			return fmt.Errorf("deleting build sandbox %s: %w", id, err)
		}
	}
	kept := map[string]bool{}
	if b.cfg.Cache != nil {
		all, err := b.cfg.Cache.BuildCacheSnapshots(ctx)
		if err != nil {
			return err
		}
		for _, id := range all {
			kept[id] = true
		}
	}
	var orphans []string
	for cursor := ""; ; {
		sns, next, err := b.cfg.Snapshots.ListSnapshots(ctx, sandbox.SnapshotListOptions{OwnerKeyID: Owner, Limit: 100, Cursor: cursor})
		if err != nil {
			return fmt.Errorf("listing build snapshots: %w", err)
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
			return fmt.Errorf("deleting build snapshot %s: %w", id, err)
		}
	}
	if len(stray)+len(orphans) > 0 {
		b.log.Info("cleared what interrupted image builds left", "sandboxes", len(stray), "snapshots", len(orphans))
	}
	return nil
}
