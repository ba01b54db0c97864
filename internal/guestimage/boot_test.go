package guestimage

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/tsc"
)

// bootMarker is what initcheck prints once it runs as PID 1 of the rootfs.
const bootMarker = "EMBERBOX-INITCHECK"

// TestBoot builds (or reuses) the real guest image and boots it under QEMU
// microvm with the initcheck program as the agent. The first run builds
// the image, which takes a few minutes; EMBERBOX_BOOT_RUNS=n boots n times.
func TestBoot(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM; skipped with -short")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("building the image needs root (mmdebstrap --mode=root)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	img, err := Ensure(ctx, Config{Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	agent := filepath.Join(dir, "initcheck")
	build := exec.CommandContext(ctx, "go", "build", "-o", agent, "../guestinit/testdata/initcheck")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building initcheck: %v\n%s", err, out)
	}
	initrd, err := BuildInitrd(img, agent, dir)
	if err != nil {
		t.Fatal(err)
	}
	khz, err := tsc.KHz()
	if err != nil {
		t.Fatal(err)
	}

	runs := 1
	if n, err := strconv.Atoi(os.Getenv("EMBERBOX_BOOT_RUNS")); err == nil && n > 0 {
		runs = n
	}
	for i := range runs {
		t.Run(fmt.Sprintf("run%d", i), func(t *testing.T) {
			bootOnce(ctx, t, img, initrd, khz)
		})
	}
}

func bootOnce(ctx context.Context, t *testing.T, img *Image, initrd string, khz int64) {
	dir := t.TempDir()
	overlay := filepath.Join(dir, "overlay.qcow2")
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2",
		"-F", "raw", "-b", img.Rootfs, overlay, "4096M").CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "agent.sock")
	console := filepath.Join(dir, "console.log")

	kernelArgs := fmt.Sprintf("console=ttyS0 reboot=k panic=-1 tsc_early_khz=%d tsc=reliable quiet emberbox.root=/dev/vda", khz)
	args := []string{
		"-M", "microvm,acpi=on,rtc=on,pit=off,pic=off",
		"-cpu", "max", "-smp", "2", "-m", "1024",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-serial", "file:" + console,
		"-kernel", img.Kernel, "-initrd", initrd, "-append", kernelArgs,
		"-drive", "id=root,file=" + overlay + ",format=qcow2,if=none",
		"-device", "virtio-blk-device,drive=root",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path=" + sock + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=org.emberbox.agent.0",
	}
	t.Logf("qemu-system-x86_64 %s", strings.Join(args, " "))

	bootCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	qemu := exec.CommandContext(bootCtx, "qemu-system-x86_64", args...)
	qemuOut, err := os.Create(filepath.Join(dir, "qemu.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer qemuOut.Close()
	qemu.Stdout, qemu.Stderr = qemuOut, qemuOut
	start := time.Now()
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	// initcheck powers the VM off right after printing the marker, so
	// QEMU exiting is the signal to look; the 3-minute context bounds a hang.
	waitErr := qemu.Wait()
	elapsed := time.Since(start)

	logData, _ := os.ReadFile(console)
	var marker string
	sc := bufio.NewScanner(strings.NewReader(string(logData)))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "guestinit:") {
			t.Log(line)
		}
		if i := strings.Index(line, bootMarker); i >= 0 && marker == "" {
			marker = line[i:]
		}
	}
	qemuLog, _ := os.ReadFile(qemuOut.Name())
	if marker == "" {
		t.Fatalf("no %s line after %v (qemu: %v)\nconsole:\n%s\nqemu:\n%s", bootMarker, elapsed.Round(time.Millisecond), waitErr, logData, qemuLog)
	}
	t.Logf("boot to power-off in %v: %s", elapsed.Round(time.Millisecond), marker)
	for _, want := range []string{bootMarker + " ok", "uid-user=1000", `python="Python 3.`, "sudo-as-user=0", "ports=org.emberbox.agent.0", "exe=/run/emberbox/emberbox-agent"} {
		if !strings.Contains(marker, want) {
			t.Errorf("marker lacks %q\nconsole:\n%s", want, logData)
		}
	}
	if waitErr != nil {
		t.Errorf("qemu: %v\n%s", waitErr, qemuLog)
	}
}
