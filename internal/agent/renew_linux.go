package agent

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// kernelSystem is the System of the running kernel: what the agent of a
// guest changes. Everything it does needs CAP_SYS_ADMIN (and
// CAP_SYS_TIME for the clock).
type kernelSystem struct{}

// defaultSystem returns the System an agent uses when its Config names
// none: the kernel's for the guest's init (PID 1), else none, so that an
// agent run on a host (the in-process agents of tests) refuses to renew
// rather than change the host.
func defaultSystem() System {
	if os.Getpid() == 1 {
		return kernelSystem{}
	}
	return nil
}

// Reseed adds seed to the input pool with RNDADDENTROPY, whose argument is
// a struct rand_pool_info { int entropy_count (bits); int buf_size
// (bytes); __u32 buf[]; }, then forces a CRNG reseed with RNDRESEEDCRNG
// (Linux 4.17 and later). The kernel has no VMGENID driver to do either on
// its own after a restore.
func (kernelSystem) Reseed(seed []byte) error {
	fd, err := unix.Open("/dev/random", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	info := make([]byte, 8+len(seed))
	binary.NativeEndian.PutUint32(info[0:], uint32(len(seed)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(seed)))
	copy(info[8:], seed)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0])))
	runtime.KeepAlive(info)
	clear(info)
	if errno != 0 {
		return fmt.Errorf("RNDADDENTROPY: %w", errno)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.RNDRESEEDCRNG, 0); errno != 0 {
		return fmt.Errorf("RNDRESEEDCRNG: %w", errno)
	}
	return nil
}

func (kernelSystem) Now() time.Time { return time.Now() }

func (kernelSystem) SetClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
}

func (kernelSystem) SetHostname(name string) error { return unix.Sethostname([]byte(name)) }

func (kernelSystem) Unmount(target string) error {
	// Detached, not refused while a reader holds the file open.
	return unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
}

func (kernelSystem) BindReadOnly(file, target string) error {
	if err := unix.Mount(file, target, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	// A bind takes its flags only from a remount of its own.
	const ro = unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("", target, "", ro, ""); err != nil {
		_ = unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("remounting read-only: %w", err)
	}
	return nil
}
