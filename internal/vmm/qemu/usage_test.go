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
	// Burn at least three clock ticks of this process's CPU.
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	after, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after < before+2*clockTick {
		t.Errorf("cpu went from %v to %v over a 50 ms busy loop", before, after)
	}
	rss, err := procRSS(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Errorf("rss %d, %v; want at least 1 MiB", rss, err)
	}
	if _, err := procCPU(-1); err == nil {
		t.Error("procCPU(-1) succeeded")
	}
}
