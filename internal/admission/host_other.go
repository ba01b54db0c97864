//go:build !linux

package admission

import (
	"errors"
	"runtime"
)

var errNoHostInfo = errors.New("host memory and disk figures are read on Linux only")

// HostCPUs returns runtime.NumCPU.
func HostCPUs() int { return runtime.NumCPU() }

// HostMemoryMiB is Linux only.
func HostMemoryMiB() (int64, error) { return 0, errNoHostInfo }

// MemAvailableMiB is Linux only.
func MemAvailableMiB() (int64, error) { return 0, errNoHostInfo }

// Swap is Linux only.
func Swap() (total, free int64, err error) { return 0, 0, errNoHostInfo }

// DiskFreeMiB is Linux only.
func DiskFreeMiB(dir string) (int64, error) { return 0, errNoHostInfo }
