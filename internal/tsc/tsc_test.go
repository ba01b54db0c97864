package tsc

import "testing"

func TestKHz(t *testing.T) {
	khz, err := KHz()
	if err != nil {
		t.Fatal(err)
	}
	// Any x86 machine of the last twenty years ticks between 500 MHz and 10 GHz.
	if khz < 500_000 || khz > 10_000_000 {
		t.Fatalf("KHz() = %d, implausible", khz)
	}
	ref, err := cpuinfoKHz()
	t.Logf("tsc %d kHz; /proc/cpuinfo cpu MHz gives %d kHz (err %v)", khz, ref, err)
}
