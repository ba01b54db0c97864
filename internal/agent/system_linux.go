package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// SetupSystem prepares the guest as init would: the pseudo file systems
// commands expect, the loopback interface, and a root file system grown to
// fill its disk. It does not wait for systemd, which never runs.
func (a *Agent) SetupSystem() error {
	mounts := []struct {
		src, dst, fstype, data string
		flags                  uintptr
	}{
		{"proc", "/proc", "proc", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"sysfs", "/sys", "sysfs", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755", unix.MS_NOSUID},
		{"devpts", "/dev/pts", "devpts", "gid=5,mode=0620,ptmxmode=0666", unix.MS_NOSUID | unix.MS_NOEXEC},
		{"tmpfs", "/dev/shm", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
		{"tmpfs", "/run", "tmpfs", "mode=0755", unix.MS_NOSUID | unix.MS_NODEV},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
	}
	for _, m := range mounts {
		if mounted(m.dst) {
			continue
		}
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", m.dst, err)
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil {
			a.log.Warn("mount failed", "target", m.dst, "err", err)
		}
	}
	for link, target := range map[string]string{
		"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
		"/dev/ptmx": "pts/ptmx",
	} {
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			_ = os.Symlink(target, link)
		}
	}
	for _, d := range []string{"/run/lock", "/run/user", "/tmp", "/var/tmp"} {
		_ = os.MkdirAll(d, 0o755)
	}
	_ = os.Chmod("/tmp", 0o1777)
	_ = os.Chmod("/var/tmp", 0o1777)
	if err := a.linkHome(); err != nil {
		a.log.Warn("linking E2B's home", "err", err)
	}
	if err := unix.Sethostname([]byte("emberbox")); err != nil {
		a.log.Warn("sethostname", "err", err)
	}
	if err := loopbackUp(); err != nil {
		a.log.Warn("bringing up lo", "err", err)
	}
	mountLayer(a.log)
	go a.growRoot()
	return nil
}

// growRoot grows the root file system to the size of its disk, which the
// host made diskMiB large over a smaller base image. Online ext4 resize is
// safe while the system runs.
func (a *Agent) growRoot() {
	start := time.Now()
	dev := rootDevice()
	if dev == "" {
		return
	}
	cmd := exec.Command("/sbin/resize2fs", dev)
	if out, err := os.CreateTemp("", "resize2fs"); err == nil {
		cmd.Stdout, cmd.Stderr = out, out
		defer os.Remove(out.Name())
		defer out.Close()
	}
	if err := a.Run(cmd); err != nil {
		a.log.Warn("growing root file system", "dev", dev, "err", err)
		return
	}
	a.log.Info("root file system grown", "dev", dev, "took", time.Since(start).Round(time.Millisecond))
}

func rootDevice() string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[1] == "/" && strings.HasPrefix(f[0], "/dev/") {
			return f[0]
		}
	}
	return ""
}

func mounted(dir string) bool {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[1] == dir {
			return true
		}
	}
	return false
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// FindPort returns the device of the virtio-serial port named name, waiting
// up to timeout for the kernel to create it.
func FindPort(name string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		matches, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, m := range matches {
			b, err := os.ReadFile(m)
			if err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(m))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port named %q after %s", name, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// DefaultPort is the port the agent serves on in a guest.
const DefaultPort = agentproto.PortName
