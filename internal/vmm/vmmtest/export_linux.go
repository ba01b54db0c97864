package vmmtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/emberbox/emberbox/internal/vmm"
)

var _ vmm.DiskExporter = (*Driver)(nil)

// ExportDisk implements vmm.DiskExporter: the fake's guests have no disk
// of their own, so the "disk" is what Snapshot wrote, mode 0644.
func (d *Driver) ExportDisk(ctx context.Context, snapDir, dst string) error {
	b, err := os.ReadFile(filepath.Join(snapDir, snapshotFile))
	if err != nil {
		return fmt.Errorf("fake export: reading the snapshot: %w", err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		return fmt.Errorf("fake export: %w", err)
	}
	return os.Chmod(dst, 0o644)
}
