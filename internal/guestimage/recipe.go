package guestimage

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// formatVersion is bumped whenever the layout of a built image or the way it
// is built changes in a way the recipe text below does not capture.
const formatVersion = "emberbox-image-v1"

// suite is the Debian release the rootfs is built from.
const suite = "bookworm"

// mirrors are passed to mmdebstrap explicitly so the host's own apt sources
// (which may include third-party repositories) never leak into the guest.
var mirrors = []string{
	"deb http://deb.debian.org/debian bookworm main",
	"deb http://deb.debian.org/debian bookworm-updates main",
	"deb http://deb.debian.org/debian-security bookworm-security main",
}

// packages are installed on top of mmdebstrap's "apt" variant (Essential
// packages plus apt), which keeps the image far smaller than "standard".
var packages = []string{
	"bash", "ca-certificates", "curl", "e2fsprogs", "findutils", "g++", "gcc",
	"git", "golang-go", "iproute2", "less", "make", "nftables", "nodejs", "npm", "passwd",
	"procps", "python3", "python3-ipykernel", "python3-matplotlib",
	"python3-matplotlib-inline", "python3-numpy", "python3-pandas", "python3-pil",
	"python3-pip", "python3-venv", "sqlite3", "sudo",
}

// mmdebstrapOptions shrink the image: no documentation, man pages or
// translations are unpacked at all.
var mmdebstrapOptions = []string{
	"--variant=apt",
	"--dpkgopt=path-exclude=/usr/share/man/*",
	"--dpkgopt=path-exclude=/usr/share/info/*",
	"--dpkgopt=path-exclude=/usr/share/doc/*",
	"--dpkgopt=path-include=/usr/share/doc/*/copyright",
	"--dpkgopt=path-exclude=/usr/share/locale/*",
	"--dpkgopt=path-include=/usr/share/locale/locale.alias",
	"--aptopt=APT::Install-Recommends \"false\"",
}

// customizeScript runs on the host after all packages are installed, with
// the root directory as $1 (mmdebstrap --customize-hook).
const customizeScript = `#!/bin/sh
set -eu
root="$1"

chroot "$root" groupadd --gid 1000 user
chroot "$root" useradd --uid 1000 --gid 1000 --groups sudo \
	--home-dir /workspace --shell /bin/bash user
mkdir -p "$root/workspace"
cp -a "$root/etc/skel/." "$root/workspace/"
chown -R 1000:1000 "$root/workspace"
chmod 0755 "$root/workspace"

printf 'user ALL=(ALL) NOPASSWD:ALL\n' >"$root/etc/sudoers.d/user"
chmod 0440 "$root/etc/sudoers.d/user"

# Debian marks the system Python as externally managed; the sandbox user
# is expected to "pip install" freely (into /workspace/.local).
printf '[global]\nbreak-system-packages = true\n' >"$root/etc/pip.conf"
chmod 0644 "$root/etc/pip.conf"
printf 'export PATH="$HOME/.local/bin:$PATH"\n' >"$root/etc/profile.d/emberbox-path.sh"

printf 'emberbox\n' >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\temberbox\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"

# mmdebstrap itself empties the apt lists and cache after this hook. Never
# touch $root/tmp here: while hooks run, mmdebstrap's own apt configuration
# lives there, and without it its cleanup "apt-get update" runs against the
# host's configuration and empties the host's apt lists.
rm -rf "$root/var/cache/debconf/"*-old "$root/var/log/"*.log "$root/var/log/apt/"* "$root/root/.cache"
: >"$root/etc/machine-id"
# mmdebstrap copies the host's resolver config in; the guest gets its own.
rm -f "$root/etc/resolv.conf"
`

// wantedModules are the kernel modules the initramfs loads (module names, as
// in modinfo). Missing ones are skipped; built-in ones need no loading.
var wantedModules = []string{
	"virtio_mmio",                // the transport for every microvm device
	"virtio_blk",                 // root disk
	"virtio_console",             // virtio-serial: the host-guest stream under QEMU
	"ext4",                       // root filesystem, and volumes
	"nbd",                        // volumes: /dev/nbdN fed over the host stream (internal/volumes)
	"virtio_rng",                 // entropy early in boot
	"vmw_vsock_virtio_transport", // the host-guest stream under Firecracker
	"virtio_balloon",             // free page reporting: freed guest memory goes back to the host
	// Egress capture (internal/agent/egress.go): a dummy interface for a
	// default route, and nftables to redirect outbound TCP and DNS to the
	// agent's relay and reject everything else at once.
	"dummy", "nf_tables", "nft_chain_nat", "nft_redir",
}

// essentialModules must exist, as a module or built in, or the guest
// cannot boot.
var essentialModules = map[string]bool{
	"virtio_mmio": true, "virtio_blk": true, "virtio_console": true, "ext4": true,
}

// kernelPackage identifies the Debian kernel an image is built with.
type kernelPackage struct {
	Name    string // e.g. linux-image-6.1.0-28-cloud-amd64
	Version string // Debian package version, e.g. 6.1.119-1
	Release string // uname -r, e.g. 6.1.0-28-cloud-amd64
}

// recipeHash keys the image cache: anything that changes what ends up in
// the image must feed into it.
func recipeHash(k kernelPackage) string {
	h := sha256.New()
	field := func(name string, values ...string) {
		fmt.Fprintf(h, "%s %d\n", name, len(values))
		for _, v := range values {
			fmt.Fprintf(h, "%d:%s\n", len(v), v)
		}
	}
	field("format", formatVersion)
	field("suite", suite)
	field("mirrors", mirrors...)
	field("packages", packages...)
	field("mmdebstrap-options", mmdebstrapOptions...)
	field("customize", customizeScript)
	field("layer-packages", layerPackages...)
	field("layer-customize", layerCustomizeScript)
	field("modules", wantedModules...)
	field("kernel", k.Name, k.Version, k.Release)
	return hex.EncodeToString(h.Sum(nil))[:32]
}
