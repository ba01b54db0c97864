package sandbox

import (
	"context"
	"fmt"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/vmm"
)

// ExportDisk writes the disk of owner's ready snapshot snapshotID to dst
// as a raw disk image (mode 0644): how a build's last step becomes an
// image's root disk. The driver must be a vmm.DiskExporter.
func (sp *Snapshots) ExportDisk(ctx context.Context, owner, snapshotID, dst string) error {
	ex, ok := sp.driver.(vmm.DiskExporter)
	if !ok {
		return errdefs.New(errdefs.ErrUnavailable, "export_unavailable", "the %s driver cannot export disks", sp.driver.Name())
	}
	sn, err := sp.getSnapshot(ctx, owner, snapshotID)
	if err != nil {
		return err
	}
	if sn.State != SnapshotReady {
		return errdefs.New(errdefs.ErrConflict, "snapshot_not_ready", "snapshot %s is %s", sn.ID, sn.State)
	}
	if err := ex.ExportDisk(ctx, sp.dir(sn.ID), dst); err != nil {
		return fmt.Errorf("exporting snapshot %s: %w", sn.ID, err)
	}
	return nil
}
