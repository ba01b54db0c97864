package guestinit

import "testing"

func TestKernelParam(t *testing.T) {
	cmdline := "console=ttyS0 emberbox.root=/dev/vdb quiet emberbox.rootx=no\n"
	if got := kernelParam(cmdline, "emberbox.root", defaultRoot); got != "/dev/vdb" {
		t.Errorf("emberbox.root = %q", got)
	}
	if got := kernelParam("console=ttyS0 emberbox.root=", "emberbox.root", defaultRoot); got != defaultRoot {
		t.Errorf("empty value: got %q, want default", got)
	}
	if got := kernelParam("", "emberbox.root", defaultRoot); got != defaultRoot {
		t.Errorf("absent: got %q, want default", got)
	}
}

func TestIsInitramfsInTest(t *testing.T) {
	if IsInitramfs() {
		t.Error("IsInitramfs() = true outside an initramfs")
	}
}
