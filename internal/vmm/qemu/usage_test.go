package qemu

import (
	"os"
	"testing"
	"time"
)

func TestProcCPUAndRSS(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Burn CPU until the count moves by two clock ticks; on a loaded
	// machine that can take far longer than the CPU time it needs.
	after := before
	for deadline := time.Now().Add(30 * time.Second); after < before+2*clockTick && time.Now().Before(deadline); {
		for end := time.Now().Add(10 * time.Millisecond); time.Now().Before(end); {
		}
		if after, err = procCPU(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if after < before+2*clockTick {
		t.Errorf("cpu went from %v to %v over 30 s of busy loops", before, after)
	}
	rss, err := procRSS(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Errorf("rss %d, %v; want at least 1 MiB", rss, err)
	}
	if _, err := procCPU(-1); err == nil {
		t.Error("procCPU(-1) succeeded")
	}
}
