package qemu_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/emberbox/emberbox/internal/guestimage"
	"github.com/emberbox/emberbox/internal/tsc"
	"github.com/emberbox/emberbox/internal/vmm"
	"github.com/emberbox/emberbox/internal/vmm/qemu"
	"github.com/emberbox/emberbox/internal/vmm/vmmtest"
)

// TestDriverContract runs the vmm driver contract against real QEMU VMs
// (under TCG where KVM does not work), booting the built guest image with
// an initramfs around the agent built from this tree.
func TestDriverContract(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs; skipped under -short")
	}
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	// Building the image takes minutes and root; `emberbox serve` and
	// `emberbox image build` do it, and the integration tests start a server.
	img, err := guestimage.Lookup(guestimage.Config{})
	if err != nil {
		t.Skipf("no guest image is built (run `emberbox image build`): %v", err)
	}
	dir := t.TempDir()
	agent := filepath.Join(dir, "emberbox-agent")
	build := exec.Command("go", "build", "-o", agent, "github.com/emberbox/emberbox/cmd/emberbox-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the agent: %v\n%s", err, out)
	}
	initrd, err := guestimage.BuildInitrd(img, agent, dir)
	if err != nil {
		t.Fatal(err)
	}
	khz, err := tsc.KHz()
	if err != nil {
		t.Fatal(err)
	}
	d, err := qemu.New(qemu.Config{
		TSCkHz:      khz,
		ProbeKernel: img.Kernel,
		ProbeCache:  filepath.Join(filepath.Dir(img.Dir), "kvm-probe"), // shared with the server
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("accel %s", d.Accel())

	n := 0
	vmmtest.TestDriver(t, d, func(t *testing.T) vmm.Spec {
		n++
		return vmm.Spec{
			ID:  fmt.Sprintf("sbx_drvtest%d_%d", os.Getpid(), n),
			Dir: t.TempDir(),
			// Small, as the contract needs no more; the disk must hold the base image.
			VCPU: 1, MemoryMiB: 1024, DiskMiB: 4096,
			Kernel: img.Kernel, Initrd: initrd, Rootfs: img.Rootfs,
		}
	})
}
