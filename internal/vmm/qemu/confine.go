package qemu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/cgroup"
	"github.com/emberbox/emberbox/internal/vmm"
)

// Default range of the host uids VMs run as, one each (gid = uid): far
// above ordinary users and the usual subordinate ranges (/etc/subuid).
const (
	DefaultUIDBase  = 1_000_000
	DefaultUIDCount = 65_536
)

// jail is what confines each VM: its own uid, cgroup and namespaces, a
// chroot holding only its files, no capabilities, QEMU's seccomp filter.
type jail struct {
	uids    *uidPool
	cgroups cgroup.Manager
	capLast int    // highest capability number of this kernel
	kvmGID  int    // group of /dev/kvm, given to VMs under KVM; -1 if none
	qemuDir string // directory of the QEMU binary, bound into the jail
}

// newJail checks that this host can confine VMs and prepares to.
func newJail(cfg Config, accel string) (*jail, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the server is not root, so it cannot give VMs their own uids, namespaces and cgroups")
	}
	help, err := exec.Command(cfg.QEMU, "-help").Output()
	if err != nil {
		return nil, fmt.Errorf("running %s -help: %w", cfg.QEMU, err)
	}
	if !strings.Contains(string(help), "\n-sandbox ") {
		return nil, fmt.Errorf("%s was built without seccomp support (-sandbox)", cfg.QEMU)
	}
	if _, err := os.Stat("/proc/self/ns/cgroup"); err != nil {
		return nil, fmt.Errorf("kernel without namespaces: %w", err)
	}
	cg := cfg.Cgroups
	if cg == nil {
		if cg, err = cgroup.Detect("/proc/self/mountinfo", "/proc/self/cgroup", cfg.CgroupParent); err != nil {
			return nil, err
		}
	}
	j := &jail{cgroups: cg, kvmGID: -1}
	base, count := cfg.UIDBase, cfg.UIDCount
	if base == 0 {
		base = DefaultUIDBase
	}
	if count == 0 {
		count = DefaultUIDCount
	}
	if base < 1000 || count < 1 || base+count > 1<<31 {
		return nil, fmt.Errorf("bad VM uid range %d+%d", base, count)
	}
	j.uids = &uidPool{base: base, count: count, held: map[int]bool{}}
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return nil, err
	}
	if j.capLast, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return nil, fmt.Errorf("reading cap_last_cap: %w", err)
	}
	if accel == "kvm" {
		var st unix.Stat_t
		if err := unix.Stat("/dev/kvm", &st); err != nil {
			return nil, err
		}
		j.kvmGID = int(st.Gid)
	}
	qemu, err := filepath.EvalSymlinks(cfg.QEMU)
	if err != nil {
		return nil, err
	}
	j.qemuDir = filepath.Dir(qemu)
	return j, nil
}

// Resource limits of a VM.
const (
	// qemuOverheadMiB is what QEMU needs besides guest RAM and the TCG
	// cache: its own heap, thread stacks, the shared libraries' pages,
	// the virtio queues and the block layer's caches. A confined idle VM
	// measured about 60 MiB of it (docs/DESIGN.md, M13); the rest is
	// room for IO bursts, whose page cache is charged to the group too
	// and reclaimed at the ceiling rather than failing.
	qemuOverheadMiB = 256
	// vmPids bounds QEMU's threads: main loop, RCU, one per vCPU, up to 64
	// block-layer workers, a few more.
	vmPids = 256
	// vmFiles bounds QEMU's open descriptors (about 60 for a VM).
	vmNoFile = 1024
)

// memoryCeiling is a VM's cgroup memory ceiling in bytes: guest RAM, the
// TCG translation cache, and QEMU's own overhead.
func memoryCeiling(spec vmm.Spec, accel string) int64 {
	mib := int64(spec.MemoryMiB) + qemuOverheadMiB
	if accel != "kvm" {
		mib += tcgCodeMiB
	}
	return mib << 20
}

// fileSizeLimit is RLIMIT_FSIZE for QEMU: the overlay may grow to the
// disk's virtual size plus qcow2 metadata (an L2 table per 512 MiB, a
// refcount block per 2 GiB at the default cluster size: far below 1/16),
// so the overlay never hits it, but nothing else QEMU could write may
// grow larger.
func fileSizeLimit(spec vmm.Spec) uint64 {
	mib := uint64(spec.DiskMiB) + uint64(spec.DiskMiB)/16 + 64
	return mib << 20
}

// setRlimits sets QEMU's resource limits, just after it starts. Limits are
// per process, so unlike namespaces and credentials they cannot be set on
// the thread that forks QEMU; QEMU is still loading its libraries when they
// land, long before it writes a byte to its disk.
func setRlimits(pid int, spec vmm.Spec) error {
	for _, l := range []struct {
		res int
		val uint64
	}{
		{unix.RLIMIT_FSIZE, fileSizeLimit(spec)},
		{unix.RLIMIT_NOFILE, vmNoFile},
		{unix.RLIMIT_CORE, 0}, // a core dump would hold the guest's memory
	} {
		if err := unix.Prlimit(pid, l.res, &unix.Rlimit{Cur: l.val, Max: l.val}, nil); err != nil {
			return fmt.Errorf("prlimit %d: %w", l.res, err)
		}
	}
	return nil
}

// removeCgroup removes the cgroup of sandbox id, if the driver makes them.
func (d *Driver) removeCgroup(id string) {
	if d.jail == nil {
		return
	}
	if err := d.jail.cgroups.Remove(id); err != nil {
		d.log.Warn("removing vm cgroup", "sandbox_id", id, "err", err)
	}
}

// uidPool hands out the VMs' uids: one per running VM, never one that a
// running process has.
type uidPool struct {
	mu          sync.Mutex
	base, count int
	held        map[int]bool
}

// take returns a free uid and holds it.
func (p *uidPool) take() (int, error) {
	busy := procUIDs()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.count {
		uid := p.base + i
		if !p.held[uid] && !busy[uid] {
			p.held[uid] = true
			return uid, nil
		}
	}
	return 0, fmt.Errorf("all %d VM uids from %d are in use", p.count, p.base)
}

// hold marks uid as in use (a reattached VM's).
func (p *uidPool) hold(uid int) {
	p.mu.Lock()
	p.held[uid] = true
	p.mu.Unlock()
}

func (p *uidPool) release(uid int) {
	p.mu.Lock()
	delete(p.held, uid)
	p.mu.Unlock()
}

// procUIDs returns the uids of the host's processes (the owners of their
// /proc directories): a VM left running by an earlier server, whose record
// this one has not read, still keeps its uid.
func procUIDs() map[int]bool {
	out := map[int]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+e.Name(), &st) == nil {
			out[int(st.Uid)] = true
		}
	}
	return out
}

// Confinement describes how VMs are confined, for `emberbox doctor` and the
// health route.
type Confinement struct {
	// Confined is false when the operator turned confinement off.
	Confined    bool   `json:"confined"`
	Accel       string `json:"accel"`
	AccelReason string `json:"accelReason,omitempty"`
	Seccomp     string `json:"seccomp"`
	// UIDMode is "per-vm" (each VM its own uid and gid from UIDRange) or
	// "server" (VMs run as the server's user).
	UIDMode      string        `json:"uidMode"`
	UIDRange     string        `json:"uidRange,omitempty"`
	Namespaces   []string      `json:"namespaces"`
	Filesystem   string        `json:"filesystem"`
	Capabilities string        `json:"capabilities"`
	Cgroup       *CgroupReport `json:"cgroup,omitempty"`
	Rlimits      []string      `json:"rlimits"`
}

// CgroupReport describes the VMs' cgroups.
type CgroupReport struct {
	Version     int      `json:"version"`
	Controllers []string `json:"controllers"`
	Parents     []string `json:"-"` // host paths: for doctor, not for /healthz
	Memory      string   `json:"memory"`
}

// Confinement reports the confinement new VMs get.
func (d *Driver) Confinement() Confinement {
	c := Confinement{
		Accel: d.accel, AccelReason: d.accelReason,
		Rlimits: []string{"fsize: disk size + 1/16 + 64 MiB", "nofile: " + strconv.Itoa(vmNoFile), "core: 0"},
	}
	if d.jail == nil {
		c.Seccomp, c.UIDMode, c.Namespaces = "off", "server", []string{}
		c.Filesystem = "the host's, as the server's user"
		c.Capabilities = "the server's"
		return c
	}
	j := d.jail
	c.Confined = true
	c.Seccomp = sandboxArg
	c.UIDMode = "per-vm"
	c.UIDRange = fmt.Sprintf("%d-%d", j.uids.base, j.uids.base+j.uids.count-1)
	c.Namespaces = []string{"mount", "pid", "net", "ipc", "uts", "cgroup"}
	c.Filesystem = "chroot to a read-only tmpfs with /usr, the kernel, initramfs and base image read-only and the disk overlay read-write"
	c.Capabilities = "none (effective, permitted, inheritable, ambient and bounding sets empty; no_new_privs)"
	tcg := ""
	if d.accel != "kvm" {
		tcg = fmt.Sprintf(" + %d MiB TCG cache", tcgCodeMiB)
	}
	c.Cgroup = &CgroupReport{
		Version: j.cgroups.Version(), Controllers: j.cgroups.Controllers(), Parents: j.cgroups.Parents(),
		Memory: fmt.Sprintf("guest memory%s + %d MiB; CPU quota = vCPUs; pids %d", tcg, qemuOverheadMiB, vmPids),
	}
	return c
}

// cpuCeiling is a VM's CPU quota in thousandths of a CPU: its vCPUs, but
// never the whole host. Half a CPU is always left to the server and the
// other VMs, so that a guest spinning (or faulting in memory, or writing its
// disk) on every vCPU of a VM as large as the host cannot starve them; on
// hosts with more CPUs than the VM has vCPUs it changes nothing.
func cpuCeiling(vcpus, hostCPUs int) int {
	return max(500, min(vcpus*1000, hostCPUs*1000-500))
}

// diskWriteBps is the sustained rate a VM may write its disk at, in bytes
// per second (bursts of up to four times that for 2 s): well above what a
// guest under TCG writes doing real work (pip, git, builds), and well below
// what lets one guest flood the host's writeback.
const diskWriteBps = 64 << 20
