package sandbox

import (
	"path/filepath"

	"github.com/emberbox/emberbox/internal/vmm"
)

// sandboxFiles says where a sandbox's files live on this server and what
// its VM boots from.
type sandboxFiles struct {
	dataDir string // sandboxes live in dataDir/sandboxes/<id>
	boot    BootFiles
}

func (f sandboxFiles) dir(id string) string { return filepath.Join(f.root(), id) }

// root holds one directory per sandbox with files on this server.
func (f sandboxFiles) root() string { return filepath.Join(f.dataDir, "sandboxes") }

// vmSpec is the spec of sb's VM.
func (f sandboxFiles) vmSpec(sb *Sandbox) vmm.Spec {
	return vmm.Spec{
		ID: sb.ID, Dir: f.dir(sb.ID), VCPU: sb.VCPU, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB,
		Kernel: f.boot.Kernel, Initrd: f.boot.Initrd, Rootfs: f.rootfs(sb), Layer: f.boot.Layer,
	}
}

// rootfs is the base disk sb boots: its image's, or the default one.
func (f sandboxFiles) rootfs(sb *Sandbox) string {
	if sb.Rootfs != "" {
		return sb.Rootfs
	}
	return f.boot.Rootfs
}
