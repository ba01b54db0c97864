package qemu

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/emberbox/emberbox/internal/vmm"
)

func TestArgs(t *testing.T) {
	spec := vmm.Spec{ID: "sbx_1", VCPU: 2, MemoryMiB: 4096, Kernel: "/k", Initrd: "/i"}
	tcg := &Driver{cfg: Config{TSCkHz: 2596144}, accel: "tcg", jail: &jail{}}
	args := strings.Join(tcg.Args(spec, jailFiles, false), " ")
	for _, want := range []string{
		"-M microvm,acpi=on,rtc=on,pit=off,pic=off", "-smp 2", "-m 4096M", "-accel tcg,thread=multi,tb-size=256",
		"tsc_early_khz=2596144 tsc=reliable", "-name emberbox-sbx_1", "-no-reboot",
		"name=org.emberbox.agent.0", "-kernel /vmlinuz -initrd /initrd",
		"-blockdev driver=file,node-name=base-file,read-only=on,filename=/rootfs.img",
		"filename=/disk.qcow2", "backing=base", "socket,id=agent,server=on,wait=off,fd=3",
		"socket,id=console,server=on,wait=off,fd=4", "socket,id=qmp,server=on,wait=off,fd=5",
		"memory-backend-file,id=ram,share=on,size=4096M,mem-path=/mem", "memory-backend=ram", "swiotlb=noforce",
		"-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("tcg args lack %q: %s", want, args)
		}
	}
	if strings.Contains(args, "-incoming") || strings.Contains(args, "snap-file") {
		t.Errorf("a boot's args restore or name a snapshot disk: %s", args)
	}
	restore := strings.Join(tcg.Args(spec, vmFiles{Kernel: "/k", Initrd: "/i", Rootfs: "/r", Disk: "/d", Mem: "/m", SnapDisk: "/s"}, true), " ")
	for _, want := range []string{"-incoming defer -S", "filename=/s", "node-name=snap,file=snap-file,backing=base", "node-name=disk,file=disk-file,backing=snap"} {
		if !strings.Contains(restore, want) {
			t.Errorf("restore args lack %q: %s", want, restore)
		}
	}
	kvm := &Driver{cfg: Config{TSCkHz: 2596144}, accel: "kvm"}
	args = strings.Join(kvm.Args(spec, vmFiles{Kernel: "/k", Initrd: "/i", Rootfs: "/a,b/rootfs.img", Disk: "disk.qcow2"}, false), " ")
	if strings.Contains(args, "tsc_early_khz") || !strings.Contains(args, "-accel kvm -cpu "+kvmCPU) {
		t.Errorf("kvm args: %s", args)
	}
	if strings.Contains(args, "-sandbox") {
		t.Errorf("unconfined args have -sandbox: %s", args)
	}
	if !strings.Contains(args, "filename=/a,,b/rootfs.img") {
		t.Errorf("a comma in a path is not escaped: %s", args)
	}
}

func TestLimits(t *testing.T) {
	spec := vmm.Spec{MemoryMiB: 4096, DiskMiB: 4096, VCPU: 2}
	if got, want := memoryCeiling(spec, "tcg"), int64(4096+256+256)<<20; got != want {
		t.Errorf("tcg ceiling %d, want %d", got, want)
	}
	if got, want := memoryCeiling(spec, "kvm"), int64(4096+256)<<20; got != want {
		t.Errorf("kvm ceiling %d, want %d", got, want)
	}
	// The overlay may hold the whole disk and its metadata.
	if got := fileSizeLimit(spec); got < (4096+4096/32)<<20 {
		t.Errorf("file size limit %d is below the overlay's maximum", got)
	}
}

func TestUIDPool(t *testing.T) {
	p := &uidPool{base: 2_000_000_000, count: 2, held: map[int]bool{}}
	a, err := p.take()
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.take()
	if err != nil || a == b {
		t.Fatalf("take = %d, %v after %d", b, err, a)
	}
	if _, err := p.take(); err == nil {
		t.Error("a third uid from a pool of two")
	}
	p.release(a)
	if c, err := p.take(); err != nil || c != a {
		t.Errorf("take after release = %d, %v; want %d", c, err, a)
	}
	// A uid a running process has is never handed out.
	q := &uidPool{base: os.Getuid(), count: 1, held: map[int]bool{}}
	if uid, err := q.take(); err == nil {
		t.Errorf("handed out uid %d, which this test runs as", uid)
	}
}

func TestProcStartTime(t *testing.T) {
	a, err := procStartTime(os.Getpid())
	if err != nil || a == 0 {
		t.Fatalf("procStartTime(self) = %d, %v", a, err)
	}
	if b, _ := procStartTime(os.Getpid()); a != b {
		t.Errorf("start time changed: %d then %d", a, b)
	}
	if _, err := procStartTime(1 << 30); err == nil {
		t.Error("no error for a pid that does not exist")
	}
}

func TestAttachRefusesStrangers(t *testing.T) {
	d := &Driver{accel: "tcg"}
	st, _ := procStartTime(os.Getpid())
	spec := vmm.Spec{ID: "sbx_x", Dir: t.TempDir()}
	for name, rec := range map[string]string{
		"garbage":            "{",
		"wrong start time":   `{"pid":` + itoa(os.Getpid()) + `,"startTime":1}`,
		"not this sandbox's": `{"pid":` + itoa(os.Getpid()) + `,"startTime":` + utoa(st) + `}`,
	} {
		if _, err := d.Attach(t.Context(), spec, []byte(rec)); err == nil {
			t.Errorf("%s: attached", name)
		}
	}
}

func TestBoundedLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	l := &boundedLog{path: path, limit: 100}
	for range 25 {
		l.Write([]byte("0123456789"))
	}
	l.Close()
	for _, p := range []string{path, path + ".1"} {
		st, err := os.Stat(p)
		if err != nil || st.Size() > 100 {
			t.Errorf("%s: %v, size %d", p, err, st.Size())
		}
	}
}

func itoa(i int) string    { return strconv.Itoa(i) }
func utoa(u uint64) string { return strconv.FormatUint(u, 10) }

func TestKillStray(t *testing.T) {
	start := func(name string) *exec.Cmd {
		// bash stays the process (it has a command after sleep), so its
		// cmdline keeps the -name argument, as a QEMU's does.
		cmd := exec.Command("bash", "-c", "sleep 60; true", "-name", name)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	target := start("emberbox-sbx_stray")
	other := start("emberbox-sbx_stray2")
	d := &Driver{accel: "tcg"}
	n, err := d.KillStray(t.Context(), vmm.Spec{ID: "sbx_stray"})
	if err != nil || n != 1 {
		t.Fatalf("KillStray = %d, %v; want 1", n, err)
	}
	if err := target.Wait(); err == nil {
		t.Error("the stray process exited cleanly; want killed")
	}
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("another sandbox's process was touched: %v", err)
	}
}

func TestCheckHardwareKVM(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	vmx := write("cpuinfo-vmx", "processor\t: 0\nflags\t\t: fpu vme vmx sse2\n")
	none := write("cpuinfo-none", "processor\t: 0\nflags\t\t: fpu vme sse2 hypervisor\n")
	modules := filepath.Join(dir, "modules")
	if err := os.MkdirAll(filepath.Join(modules, "kvm"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkHardwareKVM(vmx, modules); err != nil {
		t.Errorf("vmx CPU: %v, want usable", err)
	}
	if err := checkHardwareKVM(none, modules); err == nil {
		t.Error("CPU without vmx/svm: usable, want refused")
	}
	if err := os.MkdirAll(filepath.Join(modules, "kvm_pvm"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkHardwareKVM(vmx, modules); err == nil || !strings.Contains(err.Error(), "PVM") {
		t.Errorf("kvm_pvm loaded: %v, want refused as PVM", err)
	}
}

func TestCPUCeiling(t *testing.T) {
	for _, c := range []struct{ vcpus, host, want int }{
		{2, 2, 1500}, // a VM as large as the host leaves half a CPU
		{1, 2, 1000},
		{4, 2, 1500},
		{2, 16, 2000},
		{1, 1, 500},
	} {
		if got := cpuCeiling(c.vcpus, c.host); got != c.want {
			t.Errorf("cpuCeiling(%d vCPUs, %d host CPUs) = %d, want %d", c.vcpus, c.host, got, c.want)
		}
	}
}

// TestDeviceSetLayer: a boot with a layer gets set 3 and the layer as a
// read-only second disk after the root disk (the guest's vdb); a resume
// opens the layer the VM booted with while it exists, else the current
// one; set 2 has no layer.
func TestDeviceSetLayer(t *testing.T) {
	d := &Driver{accel: "tcg"}
	f := jailFiles
	f.Devices = 3
	args := strings.Join(d.Args(vmm.Spec{ID: "sbx_1", VCPU: 1, MemoryMiB: 512}, f, false), " ")
	layer := "-blockdev driver=file,node-name=layer-file,read-only=on,filename=/layer.img " +
		"-blockdev driver=raw,node-name=layer,file=layer-file,read-only=on -device virtio-blk-device,drive=layer"
	root := "-device virtio-blk-device,drive=root"
	if !strings.Contains(args, layer) || strings.Index(args, root) > strings.Index(args, layer) {
		t.Fatalf("set 3 args: %s", args)
	}
	f.Devices = 2
	if args := strings.Join(d.Args(vmm.Spec{ID: "sbx_1", VCPU: 1, MemoryMiB: 512}, f, false), " "); strings.Contains(args, "layer") {
		t.Fatalf("set 2 has a layer: %s", args)
	}
	if bootDevices(vmm.Spec{}) != 2 || bootDevices(vmm.Spec{Layer: "/l"}) != 3 {
		t.Fatal("a boot without a layer must get set 2, with one set 3")
	}

	dir := t.TempDir()
	booted := filepath.Join(t.TempDir(), "layer.img")
	if err := os.WriteFile(booted, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, layerFile), []byte(booted+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := layerOf(dir, vmm.Spec{Layer: "/current/layer.img"}); got != booted {
		t.Fatalf("resume opens %q, want the layer it booted with, %q", got, booted)
	}
	os.Remove(booted)
	if got := layerOf(dir, vmm.Spec{Layer: "/current/layer.img"}); got != "/current/layer.img" {
		t.Fatalf("with the booted layer gone, resume opens %q", got)
	}
}
