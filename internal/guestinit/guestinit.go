// Package guestinit is the initramfs stage of the guest agent. The agent binary
// is /init in a tiny initramfs that holds only the kernel modules needed to
// reach the root disk; it loads them, mounts the root disk and re-executes
// itself from there as PID 1. Keeping the agent out of the rootfs means a new
// agent never requires rebuilding the image.
//
// `ModulesDir`, `LoadOrderFile` and `AgentPath` are shared with
// internal/guestimage. `SwitchRoot` mounts /dev, /proc, /sys; loads the modules
// in `load-order` (`finit_module`); waits ≤ 20 s for `/dev/vda`; mounts it
// (ext4) on `/newroot`; sets the hostname; mounts tmpfs on `/newroot/run`;
// copies itself to `/run/emberbox/emberbox-agent`; empties the initramfs; moves
// /dev, /proc, /sys and the new root to `/`; chroots; and `exec`s the copy as
// PID 1.
package guestinit

// Paths inside the initramfs, shared with the host-side builder
// (internal/guestimage) so both agree on the layout.
const (
	// ModulesDir holds the modules, uncompressed, as <name>.ko.
	ModulesDir = "/lib/emberbox/modules"
	// LoadOrderFile lists module file names in ModulesDir, one a line,
	// dependencies first.
	LoadOrderFile = ModulesDir + "/load-order"
)

// Paths in the new root.
const (
	newRoot = "/newroot"
	// AgentPath is where SwitchRoot puts the agent in the new root, on a
	// tmpfs mounted at /run.
	AgentPath = "/run/emberbox/emberbox-agent"
)
