// Package qemu runs sandboxes as QEMU microVMs (-M microvm): KVM where /dev/kvm
// is usable, TCG software emulation elsewhere. The guest's disk is a qcow2
// overlay over the shared read-only base image; its agent stream is a
// virtio-serial port on a unix socket, and its console another socket the
// driver copies into a bounded log file.
//
// The only driver. `New` (finds binaries, probes KVM, `newJail`: refuses to run
// unless VMs can be confined or `Unconfined` is set), `Args`, `Start` (overlay,
// listening sockets, output FIFO, then `startJailed`, or QEMU under `Setsid`
// when unconfined), `Attach` (pid + start time + cmdline + pidfd; a gone VM's
// cgroup is removed), `DialGuest` (via `/proc/self/fd/N/` to keep socket paths
// short), `Stop` (SIGTERM repeated every 250 ms, SIGKILL after 10 s; never a
// reused pid), `copyConsole` and `copyOutput` → `boundedLog` (two 1 MiB
// generations), `Confinement` (the report `doctor` and `/healthz` show).
// `confine.go`: the uid pool, the limits, the report; `jail_linux.go`: the jail
// (see "Confinement" below).
//
// # The command line
//
// A cold boot → `Driver.Start`: `qemu-img create -f qcow2 -F raw -b
// <rootfs.img> disk.qcow2 <diskMiB>M` (new on each attempt); the server makes
// `agent.sock` and `console.sock` listening and QEMU inherits them (fds 3 and
// 4); its stdout/stderr go to the FIFO `qemu.pipe`, copied into `qemu.log`;
// QEMU is started confined (below). `Args`: `-name emberbox-<id>`, `-M
// microvm,acpi=on,rtc=on,pit=off,pic=off`, `-nodefaults -no-user-config
// -nographic -no-reboot`, `-kernel`/`-initrd`, `-append "console=ttyS0 reboot=k
// panic=-1 quiet loglevel=4 emberbox.root=/dev/vda [tsc_early_khz=N
// tsc=reliable]"`, virtio-blk on the overlay (`-blockdev` qcow2 with the base
// image as its named backing node, so the paths are the jail's;
// `discard=unmap`; under a `throttle` node of 64 MiB/s of writes, bursts of 4×
// for 2 s, so one guest cannot flood the host's writeback), serial on
// `console.sock`, virtserialport `org.emberbox.agent.0` on `agent.sock`,
// virtio-rng, from device set 2 a balloon with free page reporting
// (`devices.go`), and `-sandbox
// on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny`. No
// NIC. The manager saves `mach.Record()` (pid, start time, accel, dir) before
// dialing.
//
// # Saving a guest
//
// Saving a guest (`vmm/qemu/snapshot.go`, docs/DESIGN.md D13): guest RAM is
// `mem` in the sandbox's dir, mapped shared by QEMU
// (`memory-backend-file,share=on`), so the file always holds it. Before a pause
// or memory snapshot the manager detaches from the agent (`detach`, agent
// method `detach`: the agent ends that session and waits for a new Hello),
// holding the watcher's reconnect (`instance.saving`) until the save is done.
// `Machine.Pause`: QMP `stop` (drains and flushes the disk), a migration with
// `x-ignore-shared` of the device state alone into `state.tmp` (a descriptor
// passed with `getfd`), fsync, rename to `state`, `quit`, then `mem` written
// back and dropped from the page cache (a paused sandbox holds no host memory).
// `Driver.Resume`: QEMU on the same `mem` and disk with `-incoming defer -S`
// and `state` inherited as fd 6, QMP `migrate-incoming`, wait for `paused`.
// `Machine.Continue`: rename `state` to `state.restored`, fsync the dir,
// `cont`, remove it. `state` present always means `mem` and the disk are as it
// left them; `Driver.Saved` is that test. `Machine.Snapshot(dir, memory)`:
// `stop`, `mem` copied with its holes (`FICLONE`, else `copy_file_range` of the
// data ranges), the disk flattened onto the base image (`qemu-img convert -U
// -B`), the state saved last, `cont`. The overlay belongs to the VM's uid, so
// before root's `qemu-img` reads it its header is checked by a strict Go parser
// (qcow2.go: magic, version, cluster size, features, extensions, backing name):
// qcow2 with no external data file, no encryption, no unknown incompatible
// feature, and backed by exactly the driver's chain (the `backing` file's
// snapshot disk as qcow2, or the base image as raw; a snapshot disk over the
// base image); anything else is `disk_refused`. `Driver.Clone(snap, spec)`: a
// qcow2 overlay over the snapshot's disk (named in the file `backing`, bound
// read-only into the jail as `/snapdisk.qcow2`), and for memory its own copy of
// `mem` and `state`. A boot (`Start`) always makes a fresh, empty `mem` and
// discards any state; a VM that ends without a saved state has its `mem`
// removed.
//
// Device sets (`devices.go`): a saved state loads only into the devices it
// was saved from, so the set is recorded in the file `devices` beside `mem`
// (a boot writes the newest; `Snapshot`, `Clone` and `MoveFiles` carry it;
// `Resume` starts QEMU with it; no file is set 1, the states made before the
// record). Set 2 adds `virtio-balloon-device,free-page-reporting=on`: the
// guest reports free 2 MiB blocks and QEMU punches them out of the VM's own
// `mem` (fallocate on a `share=on` mapping of a file no other VM maps, never
// a template's: the hazard of DESIGN M7), so memory a guest frees goes back to
// the host in seconds, from the page cache and the disk alike. The agent
// trims the guest's page cache after a quiet minute (`agent/trim.go`).
//
// # TCG and KVM
//
//   - Probe: `qemu.New` opens `/dev/kvm`; refuses it at once, without booting,
//     if module `kvm_pvm` is loaded (PVM emulates guest ring 0, far slower than
//     TCG) or `/proc/cpuinfo` has no `vmx`/`svm` flag; else boots the image
//     kernel under KVM (`-m 256`, no disk, `panic=-1 -no-reboot`) and needs its
//     no-root panic to exit QEMU within 20 s, because a nested `/dev/kvm` can
//     exist and open yet fail at vCPU reset or hang the guest. Failure or
//     `--no-kvm` → TCG. (No kernel: QMP `query-kvm`.) The verdict is cached in
//     `<cache>/images/kvm-probe` per host boot id, QEMU binary and kernel, so
//     restarts skip the probe.
//   - KVM: `-accel kvm -cpu host,-arch-capabilities` (some nested hosts refuse
//     that MSR). TCG: `-accel tcg,thread=multi,tb-size=256 -cpu max` (the
//     translation cache capped at 256 MiB, so the memory ceiling holds).
//   - TCG clock: `tsc.KHz` counts RDTSC against `CLOCK_MONOTONIC_RAW` over 3 ×
//     50 ms windows (median; each sample from the quickest `clock_gettime`
//     bracket); non-amd64 falls back to `/proc/cpuinfo` `cpu MHz`. The guest
//     gets `tsc_early_khz=<kHz> tsc=reliable` (only under TCG) and skips the
//     calibration that hung ~2/3 of TCG boots (docs/DESIGN.md M2).
//     `pit=off,pic=off` is on every VM and lowers idle cost. Each sandbox
//     records its `accel`.
//
// # Confinement
//
// Every VM is confined unless the operator starts the server with
// `--unconfined` (logged as a warning at start, and shown by `doctor` and
// `/healthz` as `"confined": false`); a host that cannot confine (not root, no
// cgroups, QEMU without seccomp) makes `serve` fail until it does.
//
//   - Own uid and gid: from `--vm-uid-base` (default 1 000 000) and
//     `--vm-uid-count` (65 536), gid = uid, no supplementary groups (the
//     `/dev/kvm` group under KVM). The pool never hands out a uid a running
//     process has; a reattached VM's uid is held until it ends.
//   - The jail: `startJailed` runs on a locked OS thread that Go discards
//     afterwards. The thread unshares a mount namespace, makes mounts private,
//     mounts a 64 KiB tmpfs on `sandboxes/<id>/root`, binds into it read-only
//     `/usr` (QEMU, its libraries and firmware), `/etc/ld.so.cache`, the kernel
//     (`/vmlinuz`), initramfs (`/initrd`), base image (`/rootfs.img`), and
//     read-write the overlay (`/disk.qcow2`, owned by the VM's uid) and
//     `/dev/{null,zero,urandom}` (`/dev/kvm` under KVM), copies the merged-/usr
//     links, and remounts the tmpfs read-only. The host never sees these
//     mounts. The thread drops its whole capability bounding set, sets
//     no_new_privs and (v1) joins the VM's cgroups; then the child gets new
//     pid, net, ipc, uts and cgroup namespaces (`Cloneflags`), chroots into the
//     jail, takes the VM's uid and gid (which clears its capabilities), and
//     execs QEMU with an empty environment. QEMU installs its seccomp filter
//     before the guest runs.
//   - Not QEMU's `-runas`/`-chroot`: why is docs/DESIGN.md D11.
//   - Cgroup per VM, named after the sandbox, in `--cgroup-parent` or
//     `emberbox/` under the server's own group: memory ceiling = guest memory +
//     256 MiB TCG cache (TCG only) + 256 MiB (`memoryCeiling`; measured in
//     docs/DESIGN.md M13), CPU quota = vCPUs × 100 ms per 100 ms but never all
//     of the host (half a CPU stays free), `pids.max` 256, IO weight 100 (v2
//     `io.weight`, v1 `blkio.weight` or `blkio.bfq.weight` when the kernel has
//     one; they count only under a scheduler that honours them). v1: the
//     launching thread joins the groups before the fork, so QEMU is born in
//     them, and leaves right after; v2: QEMU is cloned into its group
//     (`CLONE_INTO_CGROUP`). The group is removed when QEMU exits (before
//     `Done` closes), when `Attach` finds the VM gone, and by `KillStray`.
//   - rlimits (set by `prlimit` just after the start, as QEMU loads its
//     libraries; the thread takes the VM's real uid and gid for the call, since
//     the server may lack `CAP_SYS_RESOURCE`): `RLIMIT_FSIZE` = disk size +
//     1/16 + 64 MiB (above the overlay's maximum), `RLIMIT_NOFILE` 1024,
//     `RLIMIT_CORE` 0.
//   - Output: QEMU's stdout/stderr go to a FIFO that the server (and a
//     restarted server) copies into `qemu.log`, 2 × 1 MiB.
//   - `internal/integration/confine_test.go` reads all of this from `/proc` for
//     a running sandbox and reattaches to it after a SIGKILL of the server.
package qemu
