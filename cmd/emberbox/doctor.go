package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/emberbox/emberbox/internal/guestimage"
	"github.com/emberbox/emberbox/internal/tsc"
	"github.com/emberbox/emberbox/internal/vmm/qemu"
)

// newDoctorCommand reports what serve would run VMs with: acceleration and
// why, and the confinement each VM gets, checked on this host.
func newDoctorCommand() *cobra.Command {
	var o serveOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Report the VMs' acceleration and confinement on this host",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The KVM probe boots the built image's kernel, if there is
			// one; its verdict is cached as serve caches it.
			var kernel, cache string
			if img, err := guestimage.Lookup(guestimage.Config{CacheDir: o.cacheDir}); err == nil {
				kernel = img.Kernel
				cache = filepath.Join(filepath.Dir(img.Dir), "kvm-probe") // as serve
			}
			khz, _ := tsc.KHz()
			drv, err := qemu.New(driverConfig(o, khz, kernel, cache, slog.New(slog.DiscardHandler)))
			if err != nil {
				return err
			}
			c := drv.Confinement()
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(c)
			}
			printConfinement(cmd.OutOrStdout(), c)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.cacheDir, "cache-dir", "", "image cache directory (default ~/.cache/emberbox)")
	f.BoolVar(&o.noKVM, "no-kvm", false, "as serve --no-kvm")
	addConfineFlags(f, &o)
	f.BoolVar(&asJSON, "json", false, "print the report as JSON, as /healthz shows it")
	return cmd
}

func printConfinement(w io.Writer, c qemu.Confinement) {
	row := func(k, v string) { fmt.Fprintf(w, "%-13s %s\n", k+":", v) }
	accel := c.Accel
	if c.AccelReason != "" {
		accel += " (" + c.AccelReason + ")"
	}
	row("accel", accel)
	if !c.Confined {
		row("confinement", "OFF (--unconfined): VMs run as the server's user with no seccomp, namespaces, chroot or cgroup")
	} else {
		row("confinement", "on")
	}
	row("seccomp", c.Seccomp)
	uid := c.UIDMode
	if c.UIDRange != "" {
		uid += " (uids " + c.UIDRange + ")"
	}
	row("uid", uid)
	row("namespaces", strings.Join(c.Namespaces, " "))
	row("filesystem", c.Filesystem)
	row("capabilities", c.Capabilities)
	if c.Cgroup != nil {
		row("cgroup", fmt.Sprintf("v%d, controllers %s", c.Cgroup.Version, strings.Join(c.Cgroup.Controllers, " ")))
		row("cgroup dirs", strings.Join(c.Cgroup.Parents, " "))
		row("limits", c.Cgroup.Memory)
	} else {
		row("cgroup", "none")
	}
	row("rlimits", strings.Join(c.Rlimits, ", "))
}
