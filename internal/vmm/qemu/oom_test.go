package qemu

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// SetOOMScore writes the VMM's oom_score_adj, and refuses a process that
// is not the one the machine started (a pid handed on) or has exited.
func TestSetOOMScore(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	st, err := procStartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	m := &machine{pid: pid, startTime: st, exited: make(chan struct{})}
	if err := m.SetOOMScore(700); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/" + itoa(pid) + "/oom_score_adj")
	if err != nil || strings.TrimSpace(string(b)) != "700" {
		t.Fatalf("oom_score_adj %q, %v; want 700", b, err)
	}
	if err := m.SetOOMScore(1001); err == nil {
		t.Error("a score out of range was taken")
	}
	other := &machine{pid: pid, startTime: st + 1, exited: make(chan struct{})}
	if err := other.SetOOMScore(100); err == nil {
		t.Error("a process with another start time was scored")
	}
	close(m.exited)
	if err := m.SetOOMScore(100); err == nil {
		t.Error("an exited vm was scored")
	}
}
