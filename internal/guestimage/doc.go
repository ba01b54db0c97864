// Package guestimage builds and caches the guest image every sandbox boots: a
// Debian cloud kernel, the few modules its initramfs must load, and a raw ext4
// rootfs made by mmdebstrap. Images are keyed by the hash of their recipe, so a
// changed package list or a new Debian kernel builds a new one.
//
// Builds and caches the image. `Ensure` resolves the kernel, flocks, builds in
// a temp dir renamed into place when complete, and falls back to the newest
// built image (`current`) if apt cannot resolve the kernel; `BuildInitrd`
// writes the cpio; `Image` describes the result.
//
//   - Rootfs: `mmdebstrap --variant=apt --mode=root` of bookworm, Debian
//     mirrors only (never the host's sources), no docs/locales; packages
//     include python3, pip, venv, numpy, pil, ipykernel, matplotlib (and
//     matplotlib-inline), pandas, gcc, g++, golang, nodejs, npm, git, curl,
//     sqlite3, sudo, e2fsprogs, iproute2, nftables. The customize hook adds
//     `user` (uid/gid 1000, home `/workspace`, group sudo),
//     `/etc/sudoers.d/user` (NOPASSWD), `pip.conf` (break-system-packages),
//     hostname/hosts, removes `resolv.conf`. `mkfs.ext4 -d -m 0` makes a raw
//     `rootfs.img` (~25 % slack).
//   - Kernel: Debian `linux-image-cloud-amd64`, resolved with `apt-cache`,
//     fetched with `apt-get download`, unpacked with `dpkg-deb -x`; keeps
//     `vmlinuz` and the `.ko` of `virtio_mmio`, `virtio_blk`, `virtio_console`,
//     `ext4` (essential), `virtio_rng`, `vmw_vsock_virtio_transport`,
//     `virtio_balloon` (free page reporting, `vmm/qemu/devices.go`), and for
//     egress capture `dummy`, `nf_tables`, `nft_chain_nat`, `nft_redir`, with
//     dependencies, in load order.
//   - Cache key `recipeHash`: sha256 over format version, suite, mirrors,
//     packages, options, customize script, modules and the kernel package
//     (name, version, release): a new Debian kernel in the host's apt index
//     means a new image.
//   - Initramfs: uncompressed newc cpio `initrd-<sha256>.cpio` with `/init`
//     (the agent), `/dev/console`, the modules and `load-order`, named by the
//     hash of agent + modules: a new agent binary gets a new initramfs, never a
//     new rootfs.
//   - Per sandbox: `disk.qcow2` overlay on the read-only raw base, virtual size
//     `diskMiB` (the cap); the guest grows ext4 online with `resize2fs`.
package guestimage
