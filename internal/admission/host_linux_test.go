package admission

import (
	"runtime"
	"testing"
)

func TestHostFigures(t *testing.T) {
	if n := HostCPUs(); n < 1 || n > runtime.NumCPU() {
		t.Errorf("HostCPUs = %d, want 1..%d", n, runtime.NumCPU())
	}
	total, err := HostMemoryMiB()
	if err != nil || total < 64 {
		t.Fatalf("HostMemoryMiB = %d, %v", total, err)
	}
	avail, err := MemAvailableMiB()
	if err != nil || avail <= 0 { // host-wide, so it may exceed a cgroup's limit
		t.Errorf("MemAvailableMiB = %d, %v", avail, err)
	}
	if st, sf, err := Swap(); err != nil || sf > st {
		t.Errorf("Swap = %d total, %d free, %v", st, sf, err)
	}
	if free, err := DiskFreeMiB(t.TempDir()); err != nil || free < 0 {
		t.Errorf("DiskFreeMiB = %d, %v", free, err)
	}
	if _, err := DiskFreeMiB("/does/not/exist"); err == nil {
		t.Error("DiskFreeMiB of a missing dir: no error")
	}
}
