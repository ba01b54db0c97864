package guestimage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// The computer-use layer: a Debian tree of its own with Chromium and the
// desktop's software (an X display, a window manager, input, a live view,
// screenshots and recordings), made into a raw ext4 image labelled
// LayerLabel beside the rootfs. Every VM gets it as a second, read-only
// disk (vmm/qemu device set 3), the same file for all: nothing of it is
// copied or downloaded per sandbox, and it does not count against a
// sandbox's disk. The agent mounts it at /run/emberbox/layer and runs its
// programs in a mount namespace rooted there, with the guest's /proc,
// /sys, /dev, /tmp, /workspace, users and resolver bound in
// (agent.LayerExec), so it works the same under any image's root,
// custom ones included.

const (
	layerName = "layer.img"
	// LayerLabel marks the layer's file system; the agent finds its disk
	// by it.
	LayerLabel  = "emberbox-layer"
	rootfsLabel = "emberbox-root"
)

// layerPackages are what the layer adds to mmdebstrap's apt variant.
var layerPackages = []string{
	"chromium", "ffmpeg", "fonts-liberation", "openbox", "x11vnc", "xdotool", "xvfb",
}

// layerCustomizeScript leaves in the layer's tree the mount points the
// agent binds the guest's own files and directories onto (a read-only
// file system cannot grow them later), and no state of the build.
const layerCustomizeScript = `#!/bin/sh
set -eu
root="$1"
mkdir -p "$root/workspace" "$root/run" "$root/tmp" "$root/proc" "$root/sys" "$root/dev"
chmod 1777 "$root/tmp"
rm -f "$root/etc/resolv.conf" "$root/etc/hosts"
for f in resolv.conf hosts passwd group; do : >>"$root/etc/$f"; done
rm -rf "$root/var/cache/debconf/"*-old "$root/var/log/"*.log "$root/var/log/apt/"* "$root/root/.cache"
: >"$root/etc/machine-id"
`

// buildLayer builds the layer's tree under tmp and its image,
// tmp/layer.img, and removes the tree.
func buildLayer(ctx context.Context, tmp string, logw *os.File) error {
	dir := filepath.Join(tmp, "layer")
	if err := buildTree(ctx, dir, layerPackages, layerCustomizeScript, logw); err != nil {
		return fmt.Errorf("the computer-use layer: %w", err)
	}
	if _, err := makeExt4(ctx, dir, filepath.Join(tmp, layerName), LayerLabel, logw); err != nil {
		return fmt.Errorf("the computer-use layer: %w", err)
	}
	return os.RemoveAll(dir)
}
