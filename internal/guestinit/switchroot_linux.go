package guestinit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// defaultRoot is the root disk: the first virtio-blk device.
const defaultRoot = "/dev/vda"

// rootWait bounds the wait for the root disk to appear after its driver
// loads; device probing is asynchronous.
const rootWait = 20 * time.Second

// IsInitramfs reports whether we are running as /init in the initramfs
// (PID 1 and the load-order file exists).
func IsInitramfs() bool {
	if os.Getpid() != 1 {
		return false
	}
	_, err := os.Stat(LoadOrderFile)
	return err == nil
}

// SwitchRoot loads the modules, mounts the root disk and execs the agent
// (a copy of the running binary) inside it as PID 1. It returns only on
// failure. logf reports progress and failures to the console.
func SwitchRoot(logf func(format string, args ...any)) error {
	start := time.Now()
	if err := mountBasics(); err != nil {
		return err
	}
	cmdline, _ := os.ReadFile("/proc/cmdline")
	root := kernelParam(string(cmdline), "emberbox.root", defaultRoot)

	if err := loadModules(logf); err != nil {
		return err
	}
	if err := waitForDevice(root, rootWait); err != nil {
		return err
	}
	if err := os.MkdirAll(newRoot, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", newRoot, err)
	}
	if err := unix.Mount(root, newRoot, "ext4", 0, ""); err != nil {
		return fmt.Errorf("mounting root %s on %s: %w", root, newRoot, err)
	}
	setHostname(logf)
	run := filepath.Join(newRoot, "run")
	if err := os.MkdirAll(run, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", run, err)
	}
	if err := unix.Mount("tmpfs", run, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mounting tmpfs on %s: %w", run, err)
	}
	agent := filepath.Join(newRoot, AgentPath)
	if err := copySelf(agent); err != nil {
		return fmt.Errorf("copying agent to %s: %w", agent, err)
	}
	// The initramfs stays mounted under the new root forever; empty it so
	// its copy of the agent and the modules do not hold guest memory.
	freeInitramfs(logf)

	for _, m := range []string{"/dev", "/proc", "/sys"} {
		target := filepath.Join(newRoot, m)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", target, err)
		}
		if err := unix.Mount(m, target, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("moving %s to %s: %w", m, target, err)
		}
	}
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("entering %s: %w", newRoot, err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving %s to /: %w", newRoot, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot into new root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("entering new root: %w", err)
	}
	logf("guestinit: root %s mounted in %d ms, starting %s", root, time.Since(start).Milliseconds(), AgentPath)
	err := unix.Exec(AgentPath, os.Args, os.Environ())
	return fmt.Errorf("executing %s: %w", AgentPath, err)
}

// mountBasics mounts /dev, /proc and /sys in the initramfs.
func mountBasics() error {
	for _, m := range []struct{ src, dir, fstype string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
	} {
		if err := os.MkdirAll(m.dir, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", m.dir, err)
		}
		err := unix.Mount(m.src, m.dir, m.fstype, unix.MS_NOSUID|unix.MS_NOEXEC, "")
		if err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mounting %s on %s: %w", m.fstype, m.dir, err)
		}
	}
	return nil
}

// loadModules loads the modules in LoadOrderFile's order. A module that
// fails to load is reported and skipped: optional ones (vsock, rng) may not
// matter, and a missing disk driver shows up as a missing root disk.
func loadModules(logf func(format string, args ...any)) error {
	f, err := os.Open(LoadOrderFile)
	if err != nil {
		return fmt.Errorf("reading module load order: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" || strings.HasPrefix(name, "#") {
			continue
		}
		if err := loadModule(filepath.Join(ModulesDir, name)); err != nil {
			logf("guestinit: loading module %s: %v", name, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading module load order: %w", err)
	}
	return nil
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if errors.Is(err, unix.EEXIST) {
		return nil // already loaded (or built in)
	}
	return err
}

// waitForDevice polls for path; udev does not exist here, but devtmpfs
// creates the node as soon as the driver has probed the disk.
func waitForDevice(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("root disk %s did not appear within %v (virtio_mmio/virtio_blk loaded? disk attached?)", path, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// copySelf copies the running executable to dst with mode 0755.
func copySelf(dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// freeInitramfs removes the initramfs files, as busybox switch_root does,
// leaving the mount points alone. Failures only cost memory.
func freeInitramfs(logf func(format string, args ...any)) {
	// Never delete anything from a real disk, whatever went wrong before.
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err != nil || (st.Type != unix.RAMFS_MAGIC && st.Type != unix.TMPFS_MAGIC) {
		logf("guestinit: / is not an initramfs; not freeing it")
		return
	}
	entries, err := os.ReadDir("/")
	if err != nil {
		logf("guestinit: freeing initramfs: %v", err)
		return
	}
	keep := map[string]bool{"dev": true, "proc": true, "sys": true, strings.TrimPrefix(newRoot, "/"): true}
	for _, e := range entries {
		if keep[e.Name()] {
			continue
		}
		if err := os.RemoveAll("/" + e.Name()); err != nil {
			logf("guestinit: freeing initramfs: %v", err)
		}
	}
}

// setHostname sets the kernel's hostname from the root's /etc/hostname.
// Nothing else would (there is no systemd), and sudo complains on every
// call when the hostname it resolves is "(none)".
func setHostname(logf func(format string, args ...any)) {
	b, err := os.ReadFile(filepath.Join(newRoot, "etc", "hostname"))
	name := strings.TrimSpace(string(b))
	if err != nil || name == "" {
		return
	}
	if err := unix.Sethostname([]byte(name)); err != nil {
		logf("guestinit: setting hostname %q: %v", name, err)
	}
}

// kernelParam returns the value of key=value on the kernel command line, or def.
func kernelParam(cmdline, key, def string) string {
	for _, f := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(f, key+"="); ok && v != "" {
			return v
		}
	}
	return def
}
