package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/emberbox/emberbox/internal/vmm"
)

var _ vmm.DiskExporter = (*Driver)(nil)

// ExportDisk implements vmm.DiskExporter: a snapshot's disk is a qcow2
// flattened onto the base image (Snapshot), so converting it to raw gives
// the whole disk. qemu-img writes no blocks it reads as zeros.
func (d *Driver) ExportDisk(ctx context.Context, snapDir, dst string) error {
	src := filepath.Join(snapDir, snapDiskFile)
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("export: the snapshot has no disk: %w", err)
	}
	_ = os.Remove(dst)
	out, err := exec.CommandContext(ctx, d.cfg.QEMUImg, "convert", "-f", "qcow2", "-O", "raw", src, dst).CombinedOutput()
	if err != nil {
		_ = os.Remove(dst)
		return fmt.Errorf("export: converting the disk: %v: %s", err, strings.TrimSpace(string(out)))
	}
	// VMs of the image read it as their own uids.
	if err := os.Chmod(dst, 0o644); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}
