package tsc

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// rdtsc returns the processor's time stamp counter.
//
//go:noescape
func rdtsc() uint64

// measure counts TSC ticks against CLOCK_MONOTONIC_RAW (not slewed by NTP)
// over a few short windows and takes the median, so one preemption or
// migration between cores does not skew the answer.
func measure() (int64, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const windows = 3
	var rates []float64
	for range windows {
		t0, c0, err := sample()
		if err != nil {
			return 0, err
		}
		time.Sleep(50 * time.Millisecond)
		t1, c1, err := sample()
		if err != nil {
			return 0, err
		}
		ns := t1 - t0
		if ns <= 0 || c1 <= c0 {
			continue
		}
		rates = append(rates, float64(c1-c0)*1e6/float64(ns)) // kHz
	}
	if len(rates) == 0 {
		return 0, errors.New("measuring tsc: counter did not advance")
	}
	slices.Sort(rates)
	return int64(math.Round(rates[len(rates)/2])), nil
}

// sample reads the clock and the TSC as close together as possible: it
// takes the reading whose clock_gettime call was quickest.
func sample() (ns int64, tsc uint64, err error) {
	best := int64(math.MaxInt64)
	for range 5 {
		var a, b unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_RAW, &a); err != nil {
			return 0, 0, fmt.Errorf("measuring tsc: %w", err)
		}
		c := rdtsc()
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_RAW, &b); err != nil {
			return 0, 0, fmt.Errorf("measuring tsc: %w", err)
		}
		if d := b.Nano() - a.Nano(); d < best {
			best = d
			ns, tsc = a.Nano()+d/2, c
		}
	}
	return ns, tsc, nil
}
