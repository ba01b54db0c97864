// Package tsc measures the host's time stamp counter rate. Under QEMU TCG the
// guest's TSC ticks at the host's rate, and telling the guest kernel that rate
// (tsc_early_khz=) is what makes it boot reliably and idle cheaply instead of
// calibrating against emulated timers.
//
// `KHz` counts RDTSC against `CLOCK_MONOTONIC_RAW` over 3 × 50 ms windows (the
// median; each sample from the quickest `clock_gettime` bracket), once, and
// caches it; off amd64 it falls back to `/proc/cpuinfo` `cpu MHz`.
package tsc

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
)

var (
	once   sync.Once
	cached int64
	errKHz error
)

// KHz returns the host TSC rate in kHz. It is measured once per process
// (about 150 ms) and cached.
func KHz() (int64, error) {
	once.Do(func() { cached, errKHz = measure() })
	return cached, errKHz
}

// cpuinfoKHz parses the first "cpu MHz" line of /proc/cpuinfo, the fallback
// where RDTSC is not available. It is the current clock, which equals the
// TSC rate only on CPUs with a constant TSC and no frequency scaling.
func cpuinfoKHz() (int64, error) {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0, fmt.Errorf("reading cpu frequency: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return 0, fmt.Errorf("parsing cpu MHz %q: %w", v, err)
		}
		return int64(math.Round(mhz * 1000)), nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading cpu frequency: %w", err)
	}
	return 0, errors.New("reading cpu frequency: no \"cpu MHz\" in /proc/cpuinfo")
}
