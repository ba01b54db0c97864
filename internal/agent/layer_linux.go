package agent

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// The computer-use layer (guestimage/layer.go) is a read-only disk with a
// Debian tree of its own: Chromium and the desktop's software. The agent
// mounts it at LayerDir when the VM has it, and LayerExec runs one of its
// programs as a user of the guest, in a mount namespace whose root is the
// layer and which sees the guest's /proc, /sys, /dev, /tmp, /workspace,
// users and resolver. So the layer's programs run under any image's root,
// and nothing of the layer is bound into the guest's own tree.

// LayerDir is where the layer is mounted.
const LayerDir = "/run/emberbox/layer"

// layerLabel is the layer's file system label (guestimage.LayerLabel).
const layerLabel = "emberbox-layer"

// mountLayer mounts the layer's disk, if the VM has one, read-only.
func mountLayer(log *slog.Logger) {
	dev := findLayerDisk()
	if dev == "" || mounted(LayerDir) {
		return
	}
	if err := os.MkdirAll(LayerDir, 0o755); err != nil {
		log.Warn("creating the layer's mount point", "err", err)
		return
	}
	flags := uintptr(unix.MS_RDONLY | unix.MS_NODEV | unix.MS_NOSUID)
	if err := unix.Mount(dev, LayerDir, "ext4", flags, "noload"); err != nil {
		log.Warn("mounting the computer-use layer", "dev", dev, "err", err)
	}
}

// findLayerDisk returns the virtio disk whose ext4 label is the layer's.
func findLayerDisk() string {
	names, _ := filepath.Glob("/sys/block/vd*")
	for _, n := range names {
		dev := "/dev/" + filepath.Base(n)
		if ext4Label(dev) == layerLabel {
			return dev
		}
	}
	return ""
}

// ext4Label reads the volume name of the ext4 file system on dev, "" if
// it has none.
func ext4Label(dev string) string {
	f, err := os.Open(dev)
	if err != nil {
		return ""
	}
	defer f.Close()
	var sb [136]byte // the superblock at 1024, up to its volume name
	if _, err := f.ReadAt(sb[:], 1024); err != nil {
		return ""
	}
	if sb[56] != 0x53 || sb[57] != 0xEF {
		return ""
	}
	name := sb[120:136]
	if i := bytes.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	return string(name)
}

// layerBinds are the guest's directories (recursively) and files the
// layer's programs see, at the same paths.
var (
	layerDirBinds  = []string{"/proc", "/sys", "/dev", "/tmp", "/workspace"}
	layerFileBinds = []string{"/etc/resolv.conf", "/etc/hosts", "/etc/passwd", "/etc/group"}
)

// LayerExec runs argv[1:] from the layer as the guest's account argv[0],
// in the working directory it was started in (or / when the layer has
// none such), and does not return unless it fails. It must run as root,
// as a process of its own: `emberbox-agent layer-exec <user> <command>
// [args…]`.
func LayerExec(argv []string) error {
	if len(argv) < 2 {
		return errors.New("layer-exec: want a user and a command")
	}
	if !mounted(LayerDir) {
		return fmt.Errorf("layer-exec: this sandbox has no computer-use layer at %s", LayerDir)
	}
	accts, _, err := readAccounts("/")
	if err != nil {
		return fmt.Errorf("layer-exec: reading accounts: %w", err)
	}
	acct := accts[argv[0]]
	if acct == nil {
		return fmt.Errorf("layer-exec: no account %q", argv[0])
	}
	cwd, _ := os.Getwd()
	// The namespace and root are this thread's until the exec.
	runtime.LockOSThread()
	if err := enterLayer(); err != nil {
		return fmt.Errorf("layer-exec: %w", err)
	}
	if err := unix.Chdir(cwd); err != nil {
		_ = unix.Chdir("/")
	}
	groups := []int{acct.gid}
	for _, g := range acct.groups {
		groups = append(groups, int(g))
	}
	if err := unix.Setgroups(groups); err != nil {
		return fmt.Errorf("layer-exec: setgroups: %w", err)
	}
	if err := unix.Setgid(acct.gid); err != nil {
		return fmt.Errorf("layer-exec: setgid: %w", err)
	}
	if err := unix.Setuid(acct.uid); err != nil {
		return fmt.Errorf("layer-exec: setuid: %w", err)
	}
	env := layerEnv(os.Environ(), acct)
	path, err := lookPath(argv[1], env)
	if err != nil {
		return fmt.Errorf("layer-exec: %s: not in the layer", argv[1])
	}
	return fmt.Errorf("layer-exec: %s: %w", path, unix.Exec(path, argv[1:], env))
}

// enterLayer unshares this thread's mount namespace, binds the guest's
// parts into the layer, and makes the layer the root (the guest's own is
// detached: nothing else of it is reachable).
func enterLayer() error {
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	// Nothing mounted here reaches the guest's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	for _, d := range layerDirBinds {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			continue
		}
		if err := unix.Mount(d, LayerDir+d, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("binding %s: %w", d, err)
		}
	}
	for _, f := range layerFileBinds {
		if st, err := os.Stat(f); err != nil || !st.Mode().IsRegular() {
			continue
		}
		if err := unix.Mount(f, LayerDir+f, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s: %w", f, err)
		}
	}
	// pivot_root, not chroot: a chrooted process may not make user
	// namespaces, and Chromium's sandbox is made of them.
	if err := unix.Chdir(LayerDir); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the guest's root: %w", err)
	}
	return unix.Chdir("/")
}

// layerEnv is the environment of a layer's program: env, with the
// account's and the layer's own.
func layerEnv(env []string, acct *account) []string {
	out := make([]string, 0, len(env)+4)
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "HOME", "USER", "LOGNAME", "PATH", "SHELL":
			continue
		}
		out = append(out, kv)
	}
	return append(out, "HOME="+acct.home, "USER="+acct.name, "LOGNAME="+acct.name,
		"PATH=/usr/local/bin:/usr/bin:/bin", "SHELL=/bin/sh")
}
