package main

import (
	"runtime/debug"
	"testing"
)

func TestSetMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	t.Setenv("GOMEMLIMIT", "")
	got, err := setMemoryLimit("")
	if err != nil || got < defaultMemoryLimitMin || got > defaultMemoryLimitMax || debug.SetMemoryLimit(-1) != got {
		t.Errorf("default: %d, %v", got, err)
	}
	if got, err := setMemoryLimit("512MiB"); err != nil || got != 512<<20 || debug.SetMemoryLimit(-1) != 512<<20 {
		t.Errorf("512MiB: %d, %v", got, err)
	}
	if got, err := setMemoryLimit("off"); err != nil || got != 0 {
		t.Errorf("off: %d, %v", got, err)
	}
	for _, bad := range []string{"1MiB", "lots", "-5GiB", "12TB"} {
		if _, err := setMemoryLimit(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
