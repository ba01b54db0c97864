package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/emberbox/emberbox/internal/guestimage"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/tsc"
	"github.com/emberbox/emberbox/internal/vmm/qemu"
)

// startDriver makes the guest's boot files and the QEMU driver that boots
// them, and says how its VMs are confined.
func (s *server) startDriver(ctx context.Context) error {
	log := s.log
	boot, err := bootFiles(ctx, s.o, log)
	if err != nil {
		return err
	}
	s.boot = boot
	khz, err := tsc.KHz()
	if err != nil {
		log.Warn("could not measure the host TSC rate; TCG guests may boot slowly", "err", err)
	}
	drv, err := qemu.New(driverConfig(s.o, khz, boot.Kernel, boot.ProbeCache, log))
	if err != nil {
		return err
	}
	s.drv = drv
	conf := drv.Confinement()
	log.Info("vm driver", "driver", drv.Name(), "accel", drv.Accel(), "tsc_khz", khz)
	if conf.Confined {
		log.Info("vms confined", "uids", conf.UIDRange, "cgroup_version", conf.Cgroup.Version,
			"cgroup_controllers", conf.Cgroup.Controllers, "seccomp", conf.Seccomp)
	} else {
		log.Warn("VMS RUN UNCONFINED (--unconfined): as root, without seccomp, namespaces, chroot or cgroups; a guest that escapes QEMU owns this host")
	}
	return nil
}

// driverConfig is the QEMU driver's configuration from the flags.
func driverConfig(o serveOptions, khz int64, kernel, probeCache string, log *slog.Logger) qemu.Config {
	return qemu.Config{
		TSCkHz: khz, DisableKVM: o.noKVM, ProbeKernel: kernel, ProbeCache: probeCache, Logger: log,
		Unconfined: o.unconfined, UIDBase: o.uidBase, UIDCount: o.uidCount, CgroupParent: o.cgroupParent,
	}
}

// bootFiles builds the image if it is missing and the initramfs that
// carries the agent.
type bootConfig struct {
	sandbox.BootFiles
	ProbeCache string // where the KVM probe's verdict is remembered
	RecipeHash string // the guest image's, the default image's digest
}

func bootFiles(ctx context.Context, o serveOptions, log *slog.Logger) (bootConfig, error) {
	img, err := guestimage.Ensure(ctx, guestimage.Config{CacheDir: o.cacheDir, Progress: os.Stderr, Logger: log})
	if err != nil {
		return bootConfig{}, fmt.Errorf("guest image: %w", err)
	}
	agentBin := o.agentBinary
	if agentBin == "" {
		exe, err := os.Executable()
		if err != nil {
			return bootConfig{}, err
		}
		agentBin = filepath.Join(filepath.Dir(exe), "emberbox-agent")
	}
	if _, err := os.Stat(agentBin); err != nil {
		return bootConfig{}, fmt.Errorf("agent binary: %w (build it with `make build`, or pass --agent-binary)", err)
	}
	initrd, err := guestimage.BuildInitrd(img, agentBin, filepath.Join(filepath.Dir(img.Dir), "initrd"))
	if err != nil {
		return bootConfig{}, fmt.Errorf("building initramfs: %w", err)
	}
	log.Info("guest image", "image", img.RecipeHash, "kernel", img.KernelVersion, "initrd", initrd)
	return bootConfig{
		BootFiles:  sandbox.BootFiles{Kernel: img.Kernel, Initrd: initrd, Rootfs: img.Rootfs, Layer: img.Layer},
		ProbeCache: filepath.Join(filepath.Dir(img.Dir), "kvm-probe"),
		RecipeHash: img.RecipeHash,
	}, nil
}
