package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/cgroup"
	"github.com/emberbox/emberbox/internal/vmm"
)

// File names inside a sandbox's directory.
const (
	diskFile     = "disk.qcow2"
	agentSocket  = "agent.sock"
	consoleSock  = "console.sock"
	ConsoleLog   = "console.log"
	qemuLog      = "qemu.log"  // QEMU's stdout and stderr, bounded like the console
	qemuPipe     = "qemu.pipe" // the FIFO QEMU writes them to
	qmpSocket    = "qmp.sock"  // QEMU's monitor, for pause, snapshots and restores
	memFile      = "mem"       // guest RAM, a file QEMU maps shared (see snapshot.go)
	consoleLimit = 1 << 20     // bytes per console log generation
)

// Config configures the driver.
type Config struct {
	QEMU    string // qemu-system-x86_64 binary; default from PATH
	QEMUImg string // qemu-img binary; default from PATH
	// TSCkHz is the host TSC rate. Under TCG the guest's TSC runs at it,
	// and telling the guest kernel (tsc_early_khz) avoids the clock
	// calibration that hangs TCG boots; see docs/DESIGN.md (M2).
	TSCkHz int64
	// DisableKVM forces TCG even where /dev/kvm works.
	DisableKVM bool
	// ProbeKernel, if set, is booted once under KVM to check that KVM
	// really runs guests here before the driver relies on it.
	ProbeKernel string
	// ProbeCache, if set, is a file that remembers the probe's verdict for
	// this host boot, QEMU binary and kernel, so restarts skip the probe.
	ProbeCache string
	Logger     *slog.Logger

	// Unconfined runs QEMU as the server's user, in its namespaces, with
	// no seccomp filter, cgroup or chroot: only for a host that cannot
	// confine VMs, on the operator's explicit request. Otherwise New
	// fails where confinement cannot be set up.
	Unconfined bool
	// UIDBase and UIDCount are the range of host uids (gid = uid) VMs
	// run as, one each; defaults DefaultUIDBase and DefaultUIDCount.
	UIDBase, UIDCount int
	// CgroupParent is where the VMs' cgroups are made, a path from each
	// hierarchy's root; "" makes them in "emberbox" under the server's
	// own cgroup.
	CgroupParent string
	// Cgroups, if set, replaces the host's cgroups (tests).
	Cgroups cgroup.Manager
}

// Driver implements vmm.Driver with QEMU.
type Driver struct {
	cfg         Config
	accel       string
	accelReason string
	log         *slog.Logger
	jail        *jail // nil: VMs run unconfined
	spares      spares
}

// New returns a driver, checking that the QEMU binaries exist.
func New(cfg Config) (*Driver, error) {
	var err error
	if cfg.QEMU == "" {
		if cfg.QEMU, err = exec.LookPath("qemu-system-x86_64"); err != nil {
			return nil, fmt.Errorf("qemu-system-x86_64 not found (install qemu-system-x86): %w", err)
		}
	}
	if cfg.QEMUImg == "" {
		if cfg.QEMUImg, err = exec.LookPath("qemu-img"); err != nil {
			return nil, fmt.Errorf("qemu-img not found (install qemu-utils): %w", err)
		}
	}
	d := &Driver{cfg: cfg, accel: "tcg", log: cfg.Logger}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if !cfg.DisableKVM {
		if err := cachedProbe(cfg.ProbeCache, cfg.QEMU, cfg.ProbeKernel); err != nil {
			d.log.Info("kvm not usable; using software emulation (tcg)", "reason", err)
			d.accelReason = err.Error()
		} else {
			d.accel = "kvm"
			d.accelReason = "a guest was seen to boot under kvm"
		}
	} else {
		d.accelReason = "kvm turned off by the operator"
	}
	if cfg.Unconfined {
		d.log.Warn("VMS RUN UNCONFINED: as the server's user, without seccomp, namespaces, chroot or cgroups (--unconfined)")
		return d, nil
	}
	if d.jail, err = newJail(cfg, d.accel); err != nil {
		return nil, fmt.Errorf("cannot confine VMs: %w (run as root on a host with cgroups, or turn confinement off explicitly)", err)
	}
	return d, nil
}

// kvmCPU is the guest CPU under KVM. arch-capabilities is off because some
// nested-virtualization hosts refuse its MSR, which aborts QEMU at reset.
const kvmCPU = "host,-arch-capabilities"

// probeKVM checks that QEMU can really run a guest under KVM here: /dev/kvm
// can exist and open yet fail at the first vCPU reset, or hang the guest
// (seen on nested hosts). With a kernel it boots it with no root disk: a
// working KVM reaches the kernel's "no root" panic and exits (panic=-1,
// -no-reboot) within seconds; otherwise it asks QMP whether KVM is enabled.
func probeKVM(qemuBin, kernel string) error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	f.Close()
	if err := checkHardwareKVM("/proc/cpuinfo", "/sys/module"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	args := []string{"-M", "microvm,acpi=on,rtc=on", "-accel", "kvm", "-cpu", kvmCPU,
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"}
	var cmd *exec.Cmd
	if kernel != "" {
		args = append(args, "-m", "256", "-serial", "stdio", "-kernel", kernel,
			"-append", "console=ttyS0 panic=-1 reboot=k loglevel=1")
		cmd = exec.CommandContext(ctx, qemuBin, args...)
	} else {
		cmd = exec.CommandContext(ctx, qemuBin, append(args, "-S", "-qmp", "stdio")...)
		cmd.Stdin = strings.NewReader(`{"execute":"qmp_capabilities"}` + "\n" +
			`{"execute":"query-kvm"}` + "\n" + `{"execute":"quit"}` + "\n")
	}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return errors.New("a guest under kvm did not boot within 20s")
	}
	if err != nil {
		return fmt.Errorf("qemu with kvm failed: %v: %s", err, lastLine(out))
	}
	if kernel == "" && !strings.Contains(string(out), `"enabled": true`) {
		return fmt.Errorf("qemu reports kvm not enabled: %s", lastLine(out))
	}
	return nil
}

// checkHardwareKVM tells at once, without booting anything, a /dev/kvm that
// cannot run a stock guest kernel: a CPU without hardware virtualization
// (no vmx or svm flag) and PVM (module kvm_pvm), which emulates the guest's
// ring 0 instruction by instruction, some 2,000 times slower than TCG (a
// Debian kernel had not finished early init after 25 s). Under nested
// hardware virtualization a working KVM shows the flag.
func checkHardwareKVM(cpuinfo, modules string) error {
	if _, err := os.Stat(filepath.Join(modules, "kvm_pvm")); err == nil {
		return errors.New("/dev/kvm is PVM (module kvm_pvm), which only guest kernels built for it can use")
	}
	b, err := os.ReadFile(cpuinfo)
	if err != nil {
		return nil // cannot tell; the boot probe decides
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, val, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) != "flags" {
			continue
		}
		for _, f := range strings.Fields(val) {
			if f == "vmx" || f == "svm" {
				return nil
			}
		}
		return errors.New("the CPU has no hardware virtualization (no vmx or svm flag)")
	}
	return nil
}

// cachedProbe runs probeKVM unless cache holds a verdict for the same host
// boot, QEMU binary and kernel.
func cachedProbe(cache, qemuBin, kernel string) error {
	// What needs no boot is decided at once, whatever a cache says.
	if err := checkHardwareKVM("/proc/cpuinfo", "/sys/module"); err != nil {
		return err
	}
	key := probeKey(qemuBin, kernel)
	if cache != "" && key != "" {
		if b, err := os.ReadFile(cache); err == nil {
			if verdict, ok := strings.CutPrefix(string(b), key+"\n"); ok {
				if verdict == "ok" {
					return nil
				}
				return errors.New(verdict)
			}
		}
	}
	err := probeKVM(qemuBin, kernel)
	if cache != "" && key != "" {
		verdict := "ok"
		if err != nil {
			verdict = err.Error()
		}
		_ = os.MkdirAll(filepath.Dir(cache), 0o755)
		_ = os.WriteFile(cache, []byte(key+"\n"+verdict), 0o644)
	}
	return err
}

func probeKey(qemuBin, kernel string) string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	var parts []string
	for _, f := range []string{qemuBin, kernel} {
		st, err := os.Stat(f)
		if err != nil {
			return ""
		}
		parts = append(parts, fmt.Sprintf("%s:%d:%d", f, st.Size(), st.ModTime().UnixNano()))
	}
	return strings.TrimSpace(string(boot)) + " " + strings.Join(parts, " ")
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// Name implements vmm.Driver.Name.
func (d *Driver) Name() string { return "qemu" }

// Accel implements vmm.Driver.Accel.
func (d *Driver) Accel() string { return d.accel }

// record is what Attach needs to find a VM again.
type record struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"` // /proc/PID/stat field 22, against pid reuse
	Accel     string `json:"accel"`
	Dir       string `json:"dir"`
	// UID is the host uid (and gid) a confined VM runs as, 0 for an
	// unconfined one; a restarted server keeps it out of the free pool
	// while the VM runs. The VM's cgroup is named after the sandbox.
	UID int `json:"uid,omitempty"`
}

// vmFiles are the paths QEMU opens for one VM: inside its jail when it is
// confined, the host's otherwise. Its two sockets are not among them: the
// server makes them and QEMU inherits them listening (agentFD, consoleFD),
// so QEMU needs no directory it can write to.
type vmFiles struct {
	Kernel, Initrd, Rootfs, Disk string
	// Mem is the guest RAM file. SnapDisk, if set, is the snapshot disk
	// (qcow2 over Rootfs) that Disk is an overlay of.
	Mem, SnapDisk string
	// Devices is the device set (devices.go); 0 means 1. Layer is the
	// computer-use layer of set 3.
	Devices int
	Layer   string
}

// Descriptors QEMU inherits: exec.Cmd.ExtraFiles start at 3.
const (
	agentFD   = 3
	consoleFD = 4
	qmpFD     = 5
	stateFD   = 6 // a restore's saved device state, read once
)

// sandboxArg turns on QEMU's seccomp filter with everything it can deny
// denied: obsolete system calls, set*uid/gid (QEMU is started unprivileged
// and never changes user, so -runas is not used), fork and exec, and
// changes of scheduling and affinity.
const sandboxArg = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// tcgCodeMiB caps the TCG translation cache. QEMU's default is 1 GiB,
// allocated as code is translated and never returned; a cap makes the VM's
// memory ceiling (memoryCeiling) meaningful. M5 in docs/DESIGN.md measured
// 96 MiB idle and 325 MiB after running compilers and interpreters; past
// the cap QEMU flushes the cache and translates again.
const tcgCodeMiB = 256

// Args returns the QEMU command line for spec, its files at the paths f.
// With restore, QEMU waits for a saved device state (-incoming defer)
// instead of booting, and stays stopped once it is loaded (-S).
func (d *Driver) Args(spec vmm.Spec, f vmFiles, restore bool) []string {
	kargs := []string{
		"console=ttyS0", "reboot=k", "panic=-1", "quiet", "loglevel=4",
		"emberbox.root=/dev/vda",
		// No 64 MiB bounce buffer: no device here needs one (M5).
		"swiotlb=noforce",
	}
	if d.accel == "tcg" && d.cfg.TSCkHz > 0 {
		kargs = append(kargs, "tsc_early_khz="+strconv.FormatInt(d.cfg.TSCkHz, 10), "tsc=reliable")
	}
	kargs = append(kargs, spec.KernelArgs...)
	args := []string{
		"-name", "emberbox-" + spec.ID,
		"-M", "microvm,acpi=on,rtc=on,pit=off,pic=off,memory-backend=ram",
		"-smp", strconv.Itoa(spec.VCPU),
		"-m", strconv.Itoa(spec.MemoryMiB) + "M",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", f.Kernel, "-initrd", f.Initrd,
		"-append", strings.Join(kargs, " "),
		// The overlay's header names the base image by its host path;
		// naming the backing node here makes QEMU open it where f says.
		"-blockdev", "driver=file,node-name=base-file,read-only=on,filename=" + optEscape(f.Rootfs),
		"-blockdev", "driver=raw,node-name=base,file=base-file,read-only=on",
	}
	backing := "base"
	if f.SnapDisk != "" {
		// A copy of a snapshot: its overlay is over the snapshot's disk,
		// which is over the base image.
		args = append(args,
			"-blockdev", "driver=file,node-name=snap-file,read-only=on,filename="+optEscape(f.SnapDisk),
			"-blockdev", "driver=qcow2,node-name=snap,file=snap-file,backing=base,read-only=on")
		backing = "snap"
	}
	args = append(args,
		"-blockdev", "driver=file,node-name=disk-file,discard=unmap,filename="+optEscape(f.Disk),
		"-blockdev", "driver=qcow2,node-name=disk,file=disk-file,backing="+backing+",discard=unmap",
		// Writes are throttled so that a guest filling its disk cannot fill
		// the host's page cache faster than the host writes it back, which
		// stalls every other VM and the server (a disk fill beside another
		// sandbox made its commands wait 1.5 s without this).
		"-object", "throttle-group,id=io,x-bps-write="+strconv.Itoa(diskWriteBps)+
			",x-bps-write-max="+strconv.Itoa(4*diskWriteBps)+",x-bps-write-max-length=2",
		"-blockdev", "driver=throttle,node-name=root,throttle-group=io,file=disk",
		"-device", "virtio-blk-device,drive=root",
		"-chardev", "socket,id=console,server=on,wait=off,fd="+strconv.Itoa(consoleFD),
		"-serial", "chardev:console",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,server=on,wait=off,fd="+strconv.Itoa(agentFD),
		"-device", "virtserialport,chardev=agent,name="+agentproto.PortName,
		"-device", "virtio-rng-device",
		// Guest RAM in a file of the sandbox's own, mapped shared: a pause
		// saves only the device state and the file keeps the memory.
		"-object", "memory-backend-file,id=ram,share=on,size="+strconv.Itoa(spec.MemoryMiB)+"M,mem-path="+optEscape(f.Mem),
		"-chardev", "socket,id=qmp,server=on,wait=off,fd="+strconv.Itoa(qmpFD),
		"-mon", "chardev=qmp,mode=control",
	)
	args = append(args, deviceArgs(f.Devices, f)...)
	if restore {
		args = append(args, "-incoming", "defer", "-S")
	}
	if d.accel == "kvm" {
		args = append(args, "-accel", "kvm", "-cpu", kvmCPU)
	} else {
		args = append(args, "-accel", "tcg,thread=multi,tb-size="+strconv.Itoa(tcgCodeMiB), "-cpu", "max")
	}
	if d.jail != nil {
		args = append(args, "-sandbox", sandboxArg)
	}
	return args
}

// optEscape escapes a value for a QEMU option string, where a comma is
// written twice.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// Start implements vmm.Driver.Start.
func (d *Driver) Start(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating sandbox dir: %w", err)
	}
	// A boot never meets the state of an earlier pause.
	discardState(spec.Dir)
	if !spec.KeepDisk {
		// Every boot gets a fresh overlay: a retry must not inherit a
		// disk a failed attempt may have left half-written.
		_ = os.Remove(filepath.Join(spec.Dir, chainFile))
		if err := d.createOverlay(ctx, spec, "", spec.Rootfs, "raw"); err != nil {
			return nil, err
		}
	}
	// And fresh memory: a boot must not read what an earlier guest left.
	if err := createMem(spec); err != nil {
		return nil, err
	}
	// A boot gets the newest devices, and records its layer.
	if err := writeDevices(spec.Dir, bootDevices(spec)); err != nil {
		return nil, err
	}
	_ = os.Remove(filepath.Join(spec.Dir, layerFile))
	if spec.Layer != "" {
		if err := os.WriteFile(filepath.Join(spec.Dir, layerFile), []byte(spec.Layer+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("recording the layer: %w", err)
		}
	}
	m, err := d.launch(ctx, spec, nil)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// createOverlay makes the sandbox's disk: a qcow2 overlay of backing (of
// format backingFmt) with the sandbox's disk size.
func (d *Driver) createOverlay(ctx context.Context, spec vmm.Spec, name, backing, backingFmt string) error {
	if name == "" {
		name = filepath.Join(spec.Dir, diskFile)
	}
	_ = os.Remove(name)
	out, err := exec.CommandContext(ctx, d.cfg.QEMUImg, "create", "-q", "-f", "qcow2",
		"-F", backingFmt, "-b", backing, name, strconv.Itoa(spec.DiskMiB)+"M").CombinedOutput()
	if err != nil {
		return fmt.Errorf("creating disk overlay: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// hostFiles are spec's files as the host sees them.
func hostFiles(spec vmm.Spec) vmFiles {
	f := vmFiles{Kernel: spec.Kernel, Initrd: spec.Initrd, Rootfs: spec.Rootfs,
		Disk: filepath.Join(spec.Dir, diskFile), Mem: filepath.Join(spec.Dir, memFile)}
	if b, err := os.ReadFile(filepath.Join(spec.Dir, chainFile)); err == nil {
		f.SnapDisk = strings.TrimSpace(string(b))
	}
	f.Devices, _ = readDevices(spec.Dir) // launch has checked it
	if f.Devices >= 3 {
		f.Layer = layerOf(spec.Dir, spec)
	}
	return f
}

// launch starts QEMU for spec: booting it, or with state set, restoring
// the device state read from it (see Resume).
func (d *Driver) launch(ctx context.Context, spec vmm.Spec, state *os.File) (*machine, error) {
	socks, err := listenSockets(spec.Dir)
	if err != nil {
		return nil, err
	}
	defer closeAll(socks)
	outR, outW, err := openOutput(spec.Dir)
	if err != nil {
		return nil, err
	}
	defer outW.Close()

	m := &machine{d: d, id: spec.ID, dir: spec.Dir, rootfs: spec.Rootfs, accel: d.accel, exited: make(chan struct{}), done: make(chan struct{})}
	cmd := exec.Command(d.cfg.QEMU)
	cmd.Stdout, cmd.Stderr = outW, outW
	cmd.ExtraFiles = socks // agentFD, consoleFD, qmpFD
	if state != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, state) // stateFD
	}
	// A clean environment: nothing of the server's reaches QEMU.
	cmd.Env = []string{}
	if _, err := readDevices(spec.Dir); err != nil {
		outR.Close()
		return nil, err
	}
	f := hostFiles(spec)
	if f.Devices >= 3 && f.Layer == "" {
		outR.Close()
		return nil, fmt.Errorf("the VM was booted with the computer-use layer, and this server has none (an image without one)")
	}
	if d.jail != nil {
		err = d.startJailed(cmd, spec, f, state != nil, m)
	} else {
		cmd.Args = append(cmd.Args, d.Args(spec, f, state != nil)...)
		cmd.Dir = spec.Dir
		// Its own session: the VM outlives a restart of the server,
		// which reattaches to it, and a terminal's signals do not reach it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		err = cmd.Start()
	}
	if err != nil {
		outR.Close()
		return nil, fmt.Errorf("starting qemu: %w", err)
	}
	m.pid = cmd.Process.Pid
	m.startTime, _ = procStartTime(m.pid)
	if d.jail == nil {
		// Same user as the server's: no privilege needed.
		if err := setRlimits(m.pid, spec); err != nil {
			d.log.Warn("setting qemu's resource limits", "sandbox_id", spec.ID, "err", err)
		}
	}
	go func() {
		_ = cmd.Wait()
		m.ended(cmd.ProcessState)
	}()
	d.log.Info("vm started", "sandbox_id", spec.ID, "pid", m.pid, "accel", d.accel, "uid", m.uid,
		"confined", d.jail != nil, "restore", state != nil)
	m.copy(func() { copyOutput(outR, spec.Dir) })
	m.copy(m.copyConsole)
	return m, nil
}

// Attach implements vmm.Driver.Attach.
func (d *Driver) Attach(ctx context.Context, spec vmm.Spec, rec []byte) (vmm.Machine, error) {
	var r record
	if err := json.Unmarshal(rec, &r); err != nil || r.PID <= 0 {
		return nil, fmt.Errorf("bad vm record: %w", vmm.ErrGone)
	}
	pidfd, err := d.find(spec.ID, r)
	if err != nil {
		// Whatever the VM left behind goes with it.
		d.removeCgroup(spec.ID)
		return nil, err
	}
	m := &machine{d: d, id: spec.ID, dir: spec.Dir, rootfs: spec.Rootfs, pid: r.PID, startTime: r.StartTime, accel: r.Accel, uid: r.UID,
		cgroup: d.jail != nil || r.UID != 0, exited: make(chan struct{}), done: make(chan struct{})}
	if d.jail != nil && r.UID != 0 {
		d.jail.uids.hold(r.UID)
	}
	go func() {
		defer unix.Close(pidfd)
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err == nil || err != unix.EINTR {
				break
			}
		}
		m.ended(nil)
	}()
	if outR, err := reopenOutput(spec.Dir); err == nil {
		m.copy(func() { copyOutput(outR, spec.Dir) })
	}
	m.copy(m.copyConsole)
	return m, nil
}

// find checks that the process r names is the VM of sandbox id and returns
// a pidfd for it. The start time guards against a reused pid; the -name
// argument against a process of another sandbox.
func (d *Driver) find(id string, r record) (int, error) {
	st, err := procStartTime(r.PID)
	if err != nil || st != r.StartTime {
		return -1, vmm.ErrGone
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", r.PID)); err != nil ||
		!strings.Contains(string(cmdline), "emberbox-"+id) {
		return -1, vmm.ErrGone
	}
	// Not our child: watch it with a pidfd, which also pins the pid.
	pidfd, err := unix.PidfdOpen(r.PID, 0)
	if err != nil {
		return -1, vmm.ErrGone
	}
	return pidfd, nil
}

type machine struct {
	d         *Driver
	id        string
	dir       string
	rootfs    string // the base image its disk is over (snapshots flatten onto it)
	pid       int
	startTime uint64
	accel     string
	uid       int            // the VM's own uid, 0 if unconfined
	cgroup    bool           // whether it has a cgroup to remove (named after the sandbox)
	exited    chan struct{}  // closed when the VMM process has exited
	logs      sync.WaitGroup // the copiers of its console and output
	done      chan struct{}  // closed once exited and everything it left is settled

	meterMu sync.Mutex
	meter   meter // usage.go
}

// copy runs one of the machine's log copiers. They write into the
// sandbox's directory, so Done waits for them: once it is closed, nothing
// of this machine writes there (a delete can remove the directory).
func (m *machine) copy(f func()) {
	m.logs.Add(1)
	go func() {
		defer m.logs.Done()
		f()
	}()
}

// ended runs once the VMM process has exited: its final CPU count is read,
// its cgroup removed and its uid freed before Done is closed, so a new boot
// of the same sandbox never meets them. ps is its wait status if this
// process started it.
func (m *machine) ended(ps *os.ProcessState) {
	m.settleUsage(ps)
	close(m.exited)
	// The copiers see EOF (or m.exited) at once; the bound only guards
	// against a log write stuck on a failing disk.
	copied := make(chan struct{})
	go func() { m.logs.Wait(); close(copied) }()
	select {
	case <-copied:
	case <-time.After(10 * time.Second):
		m.d.log.Warn("vm log copiers still running after exit", "sandbox_id", m.id)
	}
	if m.cgroup {
		m.d.removeCgroup(m.id)
	}
	if !m.d.Saved(vmm.Spec{Dir: m.dir}) {
		// Only a saved state needs the guest's memory; a restart boots
		// afresh. Its disk stays for the manager to keep or remove.
		_ = os.Remove(filepath.Join(m.dir, memFile))
	}
	if m.uid != 0 && m.d.jail != nil {
		m.d.jail.uids.release(m.uid)
	}
	close(m.done)
}

func (m *machine) Record() []byte {
	b, _ := json.Marshal(record{PID: m.pid, StartTime: m.startTime, Accel: m.accel, Dir: m.dir, UID: m.uid})
	return b
}

func (m *machine) Accel() string         { return m.accel }
func (m *machine) PID() int              { return m.pid }
func (m *machine) Done() <-chan struct{} { return m.done }

// DialGuest implements vmm.Machine.DialGuest. QEMU creates the socket just
// after it starts, so the dial retries briefly.
func (m *machine) DialGuest(ctx context.Context) (net.Conn, error) {
	return dialUnix(ctx, m.dir, agentSocket, m.done)
}

// dialUnix connects to dir/name. The path goes through /proc/self/fd so its
// length is independent of dir's (a unix socket path has 108 bytes).
func dialUnix(ctx context.Context, dir, name string, done <-chan struct{}) (net.Conn, error) {
	df, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer df.Close()
	path := fmt.Sprintf("/proc/self/fd/%d/%s", df.Fd(), name)
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connecting to %s: %w", name, err)
		case <-done:
			return nil, fmt.Errorf("connecting to %s: %w", name, vmm.ErrGone)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop implements vmm.Machine.Stop: SIGTERM lets QEMU close its disk
// cleanly; SIGKILL follows if it has not exited when ctx ends or after 10 s.
// SIGTERM is repeated: a confined QEMU is the init of its pid namespace, and
// the kernel drops signals such a process has no handler for yet, as when
// a VM is stopped right after it starts.
func (m *machine) Stop(ctx context.Context) error {
	select {
	case <-m.done:
		return nil
	default:
	}
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for term := true; term; {
		_ = m.signal(unix.SIGTERM)
		select {
		case <-m.done:
			return nil
		case <-ctx.Done():
			term = false
		case <-t.C:
			term = false
		case <-tick.C:
		}
	}
	_ = m.signal(unix.SIGKILL)
	select {
	case <-m.done:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("qemu pid %d did not exit after SIGKILL", m.pid)
	}
}

// signal signals the VMM unless its pid may have been reused.
func (m *machine) signal(sig unix.Signal) error {
	if st, err := procStartTime(m.pid); err != nil || st != m.startTime {
		return nil
	}
	return unix.Kill(m.pid, sig)
}

// copyConsole copies the guest console into console.log, keeping at most two
// generations of consoleLimit bytes, until the VM exits.
func (m *machine) copyConsole() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-m.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := dialUnix(ctx, m.dir, consoleSock, m.exited)
	if err != nil {
		return
	}
	defer c.Close()
	go func() {
		select {
		case <-m.exited:
			c.Close()
		case <-ctx.Done():
		}
	}()
	w := &boundedLog{path: filepath.Join(m.dir, ConsoleLog), limit: consoleLimit}
	defer w.Close()
	buf := make([]byte, 16<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			w.Write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// procStartTime returns field 22 of /proc/PID/stat: when the process
// started, in clock ticks since boot. With the pid it names one process.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces; fields resume after ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, errors.New("malformed stat")
	}
	if f[0] == "Z" {
		return 0, errors.New("zombie")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// KillStray implements vmm.StrayKiller: it kills every QEMU process whose
// -name is this sandbox's. Only the exact argument matches, so other
// sandboxes and other programs are never touched.
func (d *Driver) KillStray(ctx context.Context, spec vmm.Spec) (int, error) {
	want := "emberbox-" + spec.ID
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return 0, err
	}
	killed := 0
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-name" && args[i+1] == want {
				pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				if err == nil && unix.Kill(pid, unix.SIGKILL) == nil {
					killed++
				}
				break
			}
		}
	}
	// Its cgroup, and one a crash left before QEMU started, go too; a
	// killed VM leaves its group within moments.
	d.removeCgroup(spec.ID)
	return killed, nil
}
