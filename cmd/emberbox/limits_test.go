package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/emberbox/emberbox/internal/admission"
)

// limitsFrom parses args as serve's limit flags would be and builds them.
func limitsFrom(t *testing.T, args ...string) (admissionSettings, error) {
	t.Helper()
	var o limitOptions
	cmd := &cobra.Command{}
	addLimitFlags(cmd, &o)
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	return o.build(t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// With no flags the server admits on measured use: no vCPU cap, a nominal
// memory ceiling 32 times the host's, and one sandbox never larger than the
// host. --admission strict restores the nominal model.
func TestAdmissionModels(t *testing.T) {
	cpus := admission.HostCPUs()
	hostMiB, err := admission.HostMemoryMiB()
	if err != nil {
		t.Fatal(err)
	}
	usable := hostMiB - 2048

	def, err := limitsFrom(t)
	if err != nil {
		t.Fatal(err)
	}
	if def.capacity.VCPU != 0 {
		t.Errorf("measured: vCPU capacity %d, want no cap", def.capacity.VCPU)
	}
	if want := usable * 32; def.capacity.MemoryMiB != want {
		t.Errorf("measured: memory capacity %d, want %d", def.capacity.MemoryMiB, want)
	}
	if want := int(usable - 512); def.limits.MaxMemoryMiB != want {
		t.Errorf("measured: one sandbox up to %d MiB, want the host's %d", def.limits.MaxMemoryMiB, want)
	}

	strict, err := limitsFrom(t, "--admission", "strict")
	if err != nil {
		t.Fatal(err)
	}
	if strict.capacity.VCPU != 8*cpus || strict.capacity.MemoryMiB != usable {
		t.Errorf("strict: capacity %+v, want %d vCPUs and %d MiB", strict.capacity, 8*cpus, usable)
	}

	// An explicit ratio wins over the model's.
	set, err := limitsFrom(t, "--memory-overcommit", "2", "--vcpu-overcommit", "3")
	if err != nil {
		t.Fatal(err)
	}
	if set.capacity.VCPU != 3*cpus || set.capacity.MemoryMiB != 2*usable {
		t.Errorf("measured with ratios: capacity %+v, want %d vCPUs and %d MiB", set.capacity, 3*cpus, 2*usable)
	}

	for _, args := range [][]string{
		{"--admission", "loose"},
		{"--memory-overcommit", "-1"},
		{"--memory-headroom-mib", "-5"},
	} {
		if _, err := limitsFrom(t, args...); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "--")) {
			t.Errorf("%v: err %v, want one naming the flag", args, err)
		}
	}
}
