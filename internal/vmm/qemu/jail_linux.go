package qemu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/cgroup"
	"github.com/emberbox/emberbox/internal/vmm"
)

// Paths of a confined VM's files inside its jail.
var jailFiles = vmFiles{Kernel: "/vmlinuz", Initrd: "/initrd", Rootfs: "/rootfs.img", Disk: "/disk.qcow2", Mem: "/mem",
	Layer: "/layer.img"}

// jailSnapDisk is where a copy's snapshot disk is bound in its jail.
const jailSnapDisk = "/snapdisk.qcow2"

// jailRoot is the directory under the sandbox's own that is the jail's root.
const jailRoot = "root"

// vmCloneflags are the namespaces a confined QEMU gets besides its mount
// namespace: no network at all (its only channel is the inherited agent
// socket), its own pids, IPC, hostname and cgroup view.
const vmCloneflags = unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP

// start starts cmd as spec's VM, confined:
//
//   - a thread of the server, locked for this and discarded after, enters a
//     mount namespace of its own and builds the jail there: a tmpfs with
//     /usr (QEMU and its libraries) and the VM's kernel, initramfs and base
//     image bound read-only, its disk overlay read-write, and nothing
//     else, made read-only itself. The host never sees these mounts, and
//     they vanish with QEMU;
//   - the thread drops every capability from its bounding set and sets
//     no_new_privs, and joins the VM's cgroup (v1), so that QEMU is born
//     in it; under v2 QEMU is cloned into it (CLONE_INTO_CGROUP);
//   - the child gets new pid, net, ipc, uts and cgroup namespaces, chroots
//     into the jail, drops to the VM's own uid and gid with no
//     supplementary groups (which clears its capabilities), and execs QEMU,
//     which installs its seccomp filter before it runs the guest.
//
// QEMU's own -chroot and -runas are not used: they act after machine setup,
// but its seccomp filter, installed earlier, would refuse -runas's setuid
// with elevateprivileges=deny.
func (d *Driver) startJailed(cmd *exec.Cmd, spec vmm.Spec, f vmFiles, restore bool, m *machine) (err error) {
	j := d.jail
	if err := checkShared(spec, f); err != nil {
		return err
	}
	uid, err := j.uids.take()
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			j.uids.release(uid)
		}
	}()
	for _, own := range []string{f.Disk, f.Mem} {
		if err := os.Chown(own, uid, uid); err != nil {
			return err
		}
	}
	root := filepath.Join(spec.Dir, jailRoot)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	g, err := j.cgroups.Create(spec.ID, cgroup.Limits{
		MemoryBytes: memoryCeiling(spec, d.accel), MilliCPUs: cpuCeiling(spec.VCPU, runtime.NumCPU()), Pids: vmPids, IOWeight: 100,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			d.removeCgroup(spec.ID)
		}
	}()

	binds, groups, jf := d.jailBinds(spec, f)
	cmd.Args = append(cmd.Args, d.Args(spec, jf, restore)...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setsid:     true, // as unconfined: outlives the server, no terminal signals
		Chroot:     root,
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: groups},
		Cloneflags: vmCloneflags,
	}
	errc := make(chan [2]error, 1)
	go func() {
		// Never unlocked: this thread's mount namespace and bounding set
		// are changed for good, so Go ends it with the goroutine.
		runtime.LockOSThread()
		var errs [2]error
		if errs[0] = j.launch(cmd, root, binds, g); errs[0] == nil {
			errs[1] = limitAs(uid, cmd.Process.Pid, spec)
		}
		errc <- errs
	}()
	errs := <-errc
	if errs[0] != nil {
		return errs[0]
	}
	if errs[1] != nil {
		d.log.Warn("setting qemu's resource limits", "sandbox_id", spec.ID, "err", errs[1])
	}
	m.uid, m.cgroup = uid, true
	return nil
}

// checkShared checks that QEMU, as the VM's uid, can read the boot files
// VMs share.
func checkShared(spec vmm.Spec, f vmFiles) error {
	shared := []string{spec.Kernel, spec.Initrd, spec.Rootfs}
	if f.SnapDisk != "" {
		shared = append(shared, f.SnapDisk)
	}
	if f.Devices >= 3 {
		shared = append(shared, f.Layer)
	}
	for _, name := range shared {
		st, err := os.Stat(name)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o004 == 0 {
			return fmt.Errorf("%s is not readable by VMs' uids (mode %v)", name, st.Mode().Perm())
		}
	}
	return nil
}

// jailBinds is what the jail shows QEMU: the VM's files at their jailFiles
// paths, the libraries and devices QEMU needs; the supplementary groups it
// needs for them; and the files' paths as QEMU sees them.
func (d *Driver) jailBinds(spec vmm.Spec, f vmFiles) ([]bind, []uint32, vmFiles) {
	j := d.jail
	binds := []bind{
		{src: spec.Kernel, dst: jailFiles.Kernel},
		{src: spec.Initrd, dst: jailFiles.Initrd},
		{src: spec.Rootfs, dst: jailFiles.Rootfs},
		{src: f.Disk, dst: jailFiles.Disk, rw: true},
		{src: f.Mem, dst: jailFiles.Mem, rw: true},
		{src: "/usr", dst: "/usr"},
		{src: "/dev/null", dst: "/dev/null", rw: true},
		{src: "/dev/zero", dst: "/dev/zero", rw: true},
		{src: "/dev/urandom", dst: "/dev/urandom", rw: true},
	}
	if !strings.HasPrefix(j.qemuDir, "/usr/") {
		binds = append(binds, bind{src: j.qemuDir, dst: j.qemuDir})
	}
	if _, err := os.Stat("/etc/ld.so.cache"); err == nil {
		binds = append(binds, bind{src: "/etc/ld.so.cache", dst: "/etc/ld.so.cache"})
	}
	groups := []uint32{}
	if d.accel == "kvm" {
		binds = append(binds, bind{src: "/dev/kvm", dst: "/dev/kvm", rw: true})
		groups = append(groups, uint32(j.kvmGID))
	}

	jf := jailFiles
	jf.Devices = f.Devices
	if f.Devices >= 3 {
		binds = append(binds, bind{src: f.Layer, dst: jailFiles.Layer})
	} else {
		jf.Layer = ""
	}
	if f.SnapDisk != "" {
		binds = append(binds, bind{src: f.SnapDisk, dst: jailSnapDisk})
		jf.SnapDisk = jailSnapDisk
	}
	return binds, groups, jf
}

// limitAs sets the VM's rlimits. Lowering another process's limits takes
// CAP_SYS_RESOURCE, which a server in a container may lack, or a real uid
// and gid equal to the target's; so this thread takes the VM's as its real
// ids for the call, keeping root as its effective and saved ids (and so its
// capabilities), and then takes back its own. Raw system calls: Go's
// setuid functions change every thread of the process.
func limitAs(uid, pid int, spec vmm.Spec) error {
	const keep = ^uintptr(0) // -1: leave this id as it is
	set := func(nr, id uintptr) error {
		if _, _, e := unix.RawSyscall(nr, id, keep, keep); e != 0 {
			return e
		}
		return nil
	}
	if err := set(unix.SYS_SETRESGID, uintptr(uid)); err != nil {
		return fmt.Errorf("setresgid: %w", err)
	}
	defer set(unix.SYS_SETRESGID, 0)
	if err := set(unix.SYS_SETRESUID, uintptr(uid)); err != nil {
		return fmt.Errorf("setresuid: %w", err)
	}
	defer set(unix.SYS_SETRESUID, 0) // runs before the gid is restored
	return setRlimits(pid, spec)
}

// launch runs on a locked thread that is thrown away afterwards.
func (j *jail) launch(cmd *exec.Cmd, root string, binds []bind, g *cgroup.Group) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("jail: unshare: %w", err)
	}
	// Nothing mounted here propagates to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("jail: making mounts private: %w", err)
	}
	if err := buildRoot(root, binds); err != nil {
		return err
	}
	for c := 0; c <= j.capLast; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("jail: dropping capability %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("jail: no_new_privs: %w", err)
	}
	if g.Version == 1 {
		tid := unix.Gettid()
		if err := g.JoinThread(tid); err != nil {
			return err
		}
		// Out again once QEMU is born: should Go keep this thread (it
		// keeps the main thread, parked, if a locked goroutine ends on
		// it), it must not keep the VM's group from being removed.
		defer g.LeaveThread(tid)
	} else {
		fd, err := unix.Open(g.Dir("memory"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("jail: opening cgroup: %w", err)
		}
		defer unix.Close(fd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	return cmd.Start()
}

// bind is a file or directory of the host bound into the jail.
type bind struct {
	src, dst string
	rw       bool
}

// buildRoot mounts the jail's tmpfs on root and binds what QEMU needs into
// it, in the calling thread's mount namespace. The merged-/usr links (/lib,
// /lib64, /bin…) are copied as links; on a host without merged /usr those
// directories are bound like /usr.
func buildRoot(root string, binds []bind) error {
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID, "mode=0755,size=64k,nr_inodes=64"); err != nil {
		return fmt.Errorf("jail: mounting tmpfs: %w", err)
	}
	for _, name := range []string{"/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin"} {
		st, err := os.Lstat(name)
		switch {
		case err != nil:
		case st.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(name)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
				return fmt.Errorf("jail: %w", err)
			}
		case st.IsDir():
			binds = append(binds, bind{src: name, dst: name})
		}
	}
	for _, b := range binds {
		if err := b.mount(root); err != nil {
			return err
		}
	}
	if err := unix.Mount("", root, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("jail: making the root read-only: %w", err)
	}
	return nil
}

func (b bind) mount(root string) error {
	st, err := os.Stat(b.src)
	if err != nil {
		return fmt.Errorf("jail: %w", err)
	}
	dst := filepath.Join(root, b.dst)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("jail: %w", err)
	}
	if st.IsDir() {
		err = os.Mkdir(dst, 0o755)
	} else {
		err = os.WriteFile(dst, nil, 0o600)
	}
	if err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("jail: %w", err)
	}
	if err := unix.Mount(b.src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("jail: binding %s: %w", b.src, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID)
	if !b.rw {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return fmt.Errorf("jail: remounting %s: %w", b.dst, err)
	}
	return nil
}
